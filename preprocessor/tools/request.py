"""A request's tools, checked as vLLM checks them, before any template or engine time: the same plain values from
either face (HTTP's JSON, gRPC's Structs)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from splice import json_depth
from splice.errors import InvalidArgument

CHOICES = ("none", "auto", "required")
AUTO_FLAGS = "--enable-auto-tool-choice and --tool-call-parser"
# Tools a request may carry (counted before any is checked: each is validated against the JSON Schema metaschema,
# ~0.3 ms apiece). OpenAI's API takes 128; tool-heavy clients (MCP hosts) send a few hundred.
MAX_TOOLS = 1024


@dataclass(frozen=True)
class ToolSettings:
    """The server's: `splice preprocessor --tool-call-parser NAME --enable-auto-tool-choice`."""

    parser: str | None = None
    auto: bool = False

    def __post_init__(self) -> None:
        if self.auto and self.parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (vLLM's rule)")
        if self.parser is not None:
            from preprocessor.tools.parsers import get_parser

            get_parser(self.parser)  # ValueError naming the parsers there are


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[dict[str, Any], ...]  # OpenAI's tool objects, as the template gets them
    choice: str  # "none", "auto", "required", or "function": the one `name`d
    name: str | None = None
    parallel: bool = True  # false: only the first call is returned (vLLM's)

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def parameters(self, name: str) -> dict[str, Any] | None:
        return next(t["function"].get("parameters") for t in self.tools if t["function"]["name"] == name)


def _tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, Mapping):
        raise InvalidArgument(f"{where} must be an object {{'type': 'function', 'function': {{...}}}}")
    if tool.get("type", "function") != "function":
        raise InvalidArgument(f"{where}.type must be 'function', got {tool.get('type')!r}")
    function = tool.get("function")
    if not isinstance(function, Mapping):
        raise InvalidArgument(f"{where}.function must be an object with a name")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{where}.function.name must be a non-empty string")
    json_depth.check_value(tool, f"{where} (function {name[:60]!r})")  # (jsonschema and the copy below recurse)
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidArgument(f"{where}.function.description must be a string")
    parameters = function.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, Mapping):
            raise InvalidArgument(f"{where}.function.parameters must be a JSON schema object")
        try:
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except jsonschema.SchemaError as exc:
            raise InvalidArgument(f"{where}.function.parameters is not a valid JSON schema: {exc.message}") from None
    # as vLLM gives the template a tool (its pydantic models dumped): description and parameters always there (null
    # when absent), strict and defer_loading only when set, nothing else
    shaped: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    shaped.update({k: function[k] for k in ("strict", "defer_loading") if function.get(k) is not None})
    shaped_tool: dict[str, Any] = {"type": "function", "function": shaped}
    if tool.get("defer_loading") is not None:  # (vLLM's: the function's own unless it has one)
        shaped_tool["defer_loading"] = tool["defer_loading"]
        shaped.setdefault("defer_loading", tool["defer_loading"])
    return json.loads(json.dumps(shaped_tool))  # a deep copy of plain JSON


def _choice(tool_choice: Any) -> tuple[str, str | None]:
    if isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise InvalidArgument(f"tool_choice must be one of {list(CHOICES)} or {{'type': 'function', 'function': "
                                  f"{{'name': ...}}}}, got {tool_choice[:40]!r}")
        return tool_choice, None
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if tool_choice.get("type", "function") != "function" or not isinstance(name, str):
            raise InvalidArgument("tool_choice as an object must be {'type': 'function', 'function': {'name': ...}}")
        return "function", name
    raise InvalidArgument(f"tool_choice must be a string or an object, got {type(tool_choice).__name__}")


def tool_request(tools: Sequence[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None,
                 settings: ToolSettings) -> ToolRequest | None:
    """The request's tools and choice (vLLM's defaults: "auto" with tools, "none" without), or None when it has
    no tools. InvalidArgument for what vLLM refuses: a choice that needs tools without them, a name not in tools,
    "auto" on a server without --enable-auto-tool-choice."""
    checked = tuple(checked_tools(tools) or ())
    if tool_choice is None:
        choice, name = ("auto" if checked else "none"), None
    else:
        choice, name = _choice(tool_choice)
    if not checked:
        if choice in ("required", "function"):
            raise InvalidArgument(f"tool_choice {tool_choice!r} needs tools; set tools")
        return None  # "none", or "auto" with nothing to call: a plain answer
    names = [t["function"]["name"] for t in checked]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"tools name a function twice: {sorted({n for n in names if names.count(n) > 1})}")
    if choice == "function" and name not in names:
        raise InvalidArgument(f"tool_choice names function {name!r}, which is not in tools ({names[:8]})")
    if choice == "auto" and not settings.auto:
        raise InvalidArgument(f'tool_choice "auto" (the default with tools) requires {AUTO_FLAGS} to be set on '
                              f'the server; send tool_choice "none", "required" or a named function')
    return ToolRequest(checked, choice, name, True if parallel_tool_calls is None else parallel_tool_calls)


def check_tool_count(count: int) -> None:
    if count > MAX_TOOLS:
        raise InvalidArgument(f"the request has {count} tools; at most {MAX_TOOLS}")


def checked_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """The tools as the template gets them (each checked as tool_request checks it, after their count); None when
    there are none."""
    if not tools:
        return None
    check_tool_count(len(tools))
    return [_tool(t, i) for i, t in enumerate(tools)]


def _call(call: Any, where: str) -> dict[str, Any]:
    """An assistant message's tool call as templates read it: `arguments` parsed (vLLM's: Hermes-style templates
    write `tool_call.arguments | tojson`)."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise InvalidArgument(f"{where} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}")
    json_depth.check_value(call, where)
    function = dict(call["function"])
    if not isinstance(function.get("name"), str):
        raise InvalidArgument(f"{where}.function.name must be a string")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        json_depth.check_text(arguments, f"{where}.function.arguments")
        try:
            function["arguments"] = json.loads(arguments) if arguments else {}
        except ValueError:
            raise InvalidArgument(f"{where}.function.arguments is not JSON: {arguments[:40]!r}") from None
    return {**dict(call), "function": function}


def message_fields(tool_calls: Sequence[Any] | None, tool_call_id: str | None, name: str | None,
                   index: int) -> dict[str, Any]:
    """A message's fields besides role and content that templates read: an assistant's `tool_calls`, a tool
    reply's `tool_call_id`, a `name`."""
    fields: dict[str, Any] = {}
    if tool_calls:
        fields["tool_calls"] = [_call(c, f"messages[{index}].tool_calls[{i}]") for i, c in enumerate(tool_calls)]
    if tool_call_id is not None:
        fields["tool_call_id"] = tool_call_id
    if name is not None:
        fields["name"] = name
    return fields
