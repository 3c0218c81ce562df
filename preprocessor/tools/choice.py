"""The constraint `tool_choice` implies, as vLLM's get_json_schema_from_tools: a named function's answer is its
arguments (the function's parameters schema); `required`'s is a JSON list of one or more {"name", "parameters"}
objects, each a function of `tools` with its parameters (one, with parallel_tool_calls false). "auto" and "none"
constrain nothing."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from preprocessor.tools.request import ToolRequest
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from splice.structured_output import StructuredOutput

EMPTY_OBJECT = {"type": "object", "properties": {}}  # (vLLM's, for a function without parameters)


def _call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    params = {k: v for k, v in (parameters or EMPTY_OBJECT).items() if k != "$defs"}
    return {"properties": {"name": {"type": "string", "enum": [name]}, "parameters": params or EMPTY_OBJECT},
            "required": ["name", "parameters"]}


def calls_schema(request: ToolRequest) -> dict[str, Any]:
    """`required`: a list of calls, any function each. The functions' $defs are merged at the top (where their
    "#/$defs/..." references then resolve); two functions defining one name differently are refused, as vLLM's."""
    defs: dict[str, Any] = {}
    for tool in request.tools:
        for key, value in ((tool["function"].get("parameters") or {}).get("$defs") or {}).items():
            if key in defs and defs[key] != value:
                raise InvalidArgument(f"tools define $defs {key!r} twice, differently; tool_choice 'required' "
                                      f"needs one definition")
            defs[key] = value
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": [_call_schema(t["function"]["name"],
                                                                                  t["function"].get("parameters"))
                                                                     for t in request.tools]}}
    if not request.parallel:  # only the first call is returned: the answer holds one (vLLM's list is unbounded)
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def constraint_for(request: ToolRequest | None) -> StructuredOutput | None:
    """The JSON schema the answer must follow, or None when the choice leaves it free."""
    if request is None or request.choice in ("none", "auto"):
        return None
    if request.choice == "function":
        schema = request.parameters(request.name or "") or EMPTY_OBJECT
    else:
        schema = calls_schema(request)
    return StructuredOutput(kind="json", spec=json.dumps(schema, ensure_ascii=False))


def constrain(sampling: SamplingParams, constraint: StructuredOutput | None) -> SamplingParams:
    """`sampling` with the tool choice's constraint as its structured output (a caller's own beside it is refused)."""
    if constraint is None:
        return sampling
    if sampling.structured is not None:
        raise InvalidArgument('tool_choice "required" or a named function constrains the answer itself; send no '
                              'response_format or structured_outputs with it')
    return dataclasses.replace(sampling, structured=constraint)
