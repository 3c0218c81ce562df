"""tool_choice's checks (vLLM's rules) and the JSON schema `required` and a named function constrain the answer to
(vLLM's get_json_schema_from_tools): a valid call validates against it, anything else does not."""

from __future__ import annotations

import json

import jsonschema
import pytest

from preprocessor.tools.answer import ToolAnswer
from preprocessor.tools.choice import constraint_for
from preprocessor.tools.request import ToolSettings, tool_request
from splice.errors import InvalidArgument

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters
AUTO = ToolSettings("hermes", auto=True)


def _schema(tool_choice, tools=(WEATHER, TIME), parallel=None) -> dict:
    constraint = constraint_for(tool_request(list(tools), tool_choice, parallel, AUTO))
    assert constraint is not None and constraint.kind == "json"
    return json.loads(constraint.spec)


def _valid(schema: dict, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_named_function_answers_with_its_arguments():
    schema = _schema({"type": "function", "function": {"name": "get_weather"}})
    assert schema == WEATHER["function"]["parameters"]
    assert _valid(schema, {"city": "Paris"}) and not _valid(schema, {"town": "Paris"})
    assert _schema({"type": "function", "function": {"name": "get_time"}}) == {"type": "object", "properties": {}}


def test_required_answers_with_a_list_of_calls():
    schema = _schema("required")
    assert _valid(schema, [{"name": "get_weather", "parameters": {"city": "Paris"}}])
    assert _valid(schema, [{"name": "get_time", "parameters": {}},
                           {"name": "get_weather", "parameters": {"city": "x"}}])
    for bad in ([], [{"name": "get_weather", "parameters": {}}], [{"name": "nope", "parameters": {}}],
                {"name": "get_time", "parameters": {}}, [{"name": "get_time"}]):
        assert not _valid(schema, bad), bad
    # a valid answer is the calls
    text = json.dumps([{"name": "get_weather", "parameters": {"city": "Paris"}}])
    answer = ToolAnswer(tool_request([WEATHER], "required", None, AUTO)).whole(text, "stop")
    assert [(c.name, json.loads(c.arguments)) for c in answer.calls] == [("get_weather", {"city": "Paris"})]
    assert answer.finish_reason == "tool_calls" and answer.content == ""


def test_required_without_parallel_calls_answers_with_one_call():
    one = [{"name": "get_weather", "parameters": {"city": "Paris"}}]
    two = [*one, {"name": "get_time", "parameters": {}}]
    assert _valid(_schema("required", parallel=False), one) and not _valid(_schema("required", parallel=False), two)
    assert _valid(_schema("required", parallel=True), two)


def test_required_merges_defs():
    with_defs = {"type": "function", "function": {"name": "place", "parameters": {
        "type": "object", "properties": {"at": {"$ref": "#/$defs/point"}}, "required": ["at"],
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}}}
    schema = _schema("required", (with_defs,))
    assert "point" in schema["$defs"]
    assert _valid(schema, [{"name": "place", "parameters": {"at": {"x": 1}}}])
    assert not _valid(schema, [{"name": "place", "parameters": {"at": {"x": "one"}}}])
    clash = json.loads(json.dumps(with_defs))
    clash["function"]["name"] = "other"
    clash["function"]["parameters"]["$defs"]["point"] = {"type": "string"}
    with pytest.raises(InvalidArgument, match="point"):
        _schema("required", (with_defs, clash))


def test_auto_and_none_constrain_nothing():
    assert constraint_for(tool_request([WEATHER], "auto", None, AUTO)) is None
    assert constraint_for(tool_request([WEATHER], "none", None, AUTO)) is None
    assert tool_request(None, None, None, ToolSettings()) is None
    assert tool_request([], "auto", None, ToolSettings()) is None  # nothing to call: a plain answer


@pytest.mark.parametrize(("tools", "choice", "settings", "match"), [
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, AUTO, "'nope'"),
    ([WEATHER], None, ToolSettings(), "--enable-auto-tool-choice"),  # vLLM's default with tools is "auto"
    ([WEATHER], "auto", ToolSettings("hermes"), "--enable-auto-tool-choice"),
    (None, "required", AUTO, "needs tools"),
    (None, {"type": "function", "function": {"name": "f"}}, AUTO, "needs tools"),
    ([WEATHER], "sometimes", AUTO, "tool_choice must be one of"),
    ([WEATHER, WEATHER], "required", AUTO, "twice"),
    ([{"type": "function", "function": {}}], "required", AUTO, r"tools\[0\].function.name"),
    ([{"type": "retrieval"}], "required", AUTO, r"tools\[0\].type"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}], "required", AUTO,
     r"tools\[0\].function.parameters"),
])
def test_refusals_name_the_field(tools, choice, settings, match):
    with pytest.raises(InvalidArgument, match=match):
        tool_request(tools, choice, None, settings)


def test_server_settings():
    with pytest.raises(ValueError, match="--tool-call-parser"):
        ToolSettings(None, auto=True)
    with pytest.raises(ValueError, match="hermes"):
        ToolSettings("nope")


@pytest.mark.parametrize("raw", ['{"city": "Pa\tri\x01s"}',
                                 # JSON's own whitespace between tokens (the grammars' default) stays as it is
                                 '{\n\t"city"\r\n :\t"Pa\tri\x01s" \n}'])
def test_control_characters_in_constrained_arguments_come_out_escaped(raw):
    # xgrammar's JSON strings admit raw control characters (a random model writes them); JSON does not
    named = ToolAnswer(tool_request([WEATHER], {"type": "function", "function": {"name": "get_weather"}}, None, AUTO))
    assert json.loads(named.whole(raw, "stop").calls[0].arguments) == {"city": "Pa\tri\x01s"}
    streamed = ToolAnswer(tool_request([WEATHER], {"type": "function", "function": {"name": "get_weather"}}, None,
                                       AUTO))
    parts = [streamed.delta(raw[:12], False, None)[0], streamed.delta(raw[12:], True, "stop")[0]]
    assert json.loads("".join(p.calls[0].arguments for p in parts)) == {"city": "Pa\tri\x01s"}
    required = ToolAnswer(tool_request([WEATHER], "required", None, AUTO))
    calls = required.whole(f'[{{"name": "get_weather", "parameters": {raw}}}]', "stop").calls
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Pa\tri\x01s"}]
