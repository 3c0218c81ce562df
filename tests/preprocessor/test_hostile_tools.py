"""Issue 40 rows 1, 2, 7: a request's tools and tool calls are checked from their shape before anything recurses on
them or walks them one by one: a tool nested past splice/json_depth.py's cap, or an assistant turn whose call's
arguments are, is refused naming it and its depth (a RecursionError and a 500 before); tools are counted before any
is checked (60,000 of them were validated one by one, twice, on the event loop)."""

from __future__ import annotations

import pytest

from preprocessor.tools.choice import constraint_for
from preprocessor.tools.request import MAX_TOOLS, ToolSettings, message_fields, tool_request
from splice.errors import InvalidArgument
from splice.grammar import check as check_grammar
from splice.json_depth import MAX_JSON_DEPTH


def _deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize("choice", ["none", "required"])
def test_a_tool_past_the_depth_cap_is_refused_naming_it(choice):
    with pytest.raises(InvalidArgument, match=r"^tools\[1\] \(function 'deep'\) nests 203 levels of arrays and "
                                              rf"objects; at most {MAX_JSON_DEPTH}$"):
        tool_request([_tool("flat", {"type": "object"}), _tool("deep", _deep(100))], choice, None, ToolSettings())
    # the deepest allowed (tool > function > parameters > ...), and the schema its choice implies is a valid spec
    request = tool_request([_tool("ok", _deep((MAX_JSON_DEPTH - 3) // 2))], choice, None, ToolSettings())
    assert request.names == ["ok"]
    if (constraint := constraint_for(request)) is not None:
        check_grammar(constraint)


def test_tools_are_counted_before_any_is_checked():
    bad = [{"type": "function", "function": {"name": ""}}] * (MAX_TOOLS + 1)  # (each alone would be refused)
    with pytest.raises(InvalidArgument, match=rf"^the request has {MAX_TOOLS + 1} tools; at most {MAX_TOOLS}$"):
        tool_request(bad, "none", None, ToolSettings())


def test_a_call_whose_arguments_nest_past_the_cap_is_refused_naming_it():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}
    with pytest.raises(InvalidArgument, match=r"^messages\[3\]\.tool_calls\[0\]\.function\.arguments nests 5000 "
                                              r"levels"):
        message_fields([call], None, None, 3)
    call["function"]["arguments"] = {"a": _deep(40)}  # (given as an object, not text)
    with pytest.raises(InvalidArgument, match=r"^messages\[3\]\.tool_calls\[0\] nests 84 levels"):
        message_fields([call], None, None, 3)
    call["function"]["arguments"] = '{"city": ["Paris", {"near": ["Lyon"]}]}'
    assert message_fields([call], None, None, 3)["tool_calls"][0]["function"]["arguments"] == {
        "city": ["Paris", {"near": ["Lyon"]}]}
