"""The tool-call parsers on the outputs vLLM's own tests use (tests/tool_parsers/ of vLLM 0.33), whole and streamed:
a streamed answer, fed in pieces of any size, ends with the same content and calls as the whole one."""

from __future__ import annotations

import json

import pytest

from preprocessor.outputs import ToolCallDelta
from preprocessor.tools.answer import Delta, ToolAnswer
from preprocessor.tools.parsers import get_parser, parser_names
from preprocessor.tools.request import ToolRequest

HERMES_ONE = ('<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX", '
              '"unit": "fahrenheit"}}\n</tool_call>')
HERMES_TWO = (HERMES_ONE + '\n<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Orlando"}}\n'
              '</tool_call>')
WEATHER = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}


def _calls(extracted) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in extracted.calls]


def test_the_parsers_there_are():
    assert parser_names() == ["hermes", "llama3_json", "pythonic"]
    with pytest.raises(ValueError, match="hermes"):
        get_parser("nope")


def test_hermes():
    hermes = get_parser("hermes")
    assert _calls(hermes.extract(HERMES_ONE)) == [("get_current_weather", WEATHER)]
    assert hermes.extract(HERMES_ONE).content is None
    two = hermes.extract("Let me check. " + HERMES_TWO)
    assert two.content == "Let me check. "
    assert _calls(two) == [("get_current_weather", WEATHER), ("get_current_weather", {"city": "Orlando"})]
    assert hermes.extract("How can I help you today?").calls == ()
    assert hermes.extract("How can I help you today?").content == "How can I help you today?"
    # cut short after whole JSON: still a call (vLLM's second alternative); not JSON: all content
    assert _calls(hermes.extract('<tool_call>{"name": "f", "arguments": {"a": 1}}')) == [("f", {"a": 1})]
    broken = '<tool_call>{"name": "f", "argu'
    assert hermes.extract(broken).calls == () and hermes.extract(broken).content == broken
    assert json.loads(hermes.extract('<tool_call>{"name": "f", "arguments": {"é": "ü"}}</tool_call>')
                      .calls[0].arguments) == {"é": "ü"}
    assert '"ü"' in hermes.extract('<tool_call>{"name": "f", "arguments": {"é": "ü"}}</tool_call>').calls[0].arguments


def test_llama3_json():
    llama = get_parser("llama3_json")
    out = llama.extract('{"name": "getOpenIncidentsTool", "parameters": {}}')
    assert _calls(out) == [("getOpenIncidentsTool", {})] and out.content is None
    out = llama.extract('<|python_tag|>{"name": "searchTool", "parameters": {"query": "code"}}; '
                        '{"name": "getOpenIncidentsTool", "arguments": {"limit": 3}}')
    assert _calls(out) == [("searchTool", {"query": "code"}), ("getOpenIncidentsTool", {"limit": 3})]
    nested = llama.extract('{"name": "f", "arguments": {"inner": {"x": [1, {"y": 2}]}}}')
    assert _calls(nested) == [("f", {"inner": {"x": [1, {"y": 2}]}})]
    assert llama.extract("Hello there").calls == ()
    no_name = '{"arguments": {}}'
    assert llama.extract(no_name).calls == () and llama.extract(no_name).content == no_name


def test_pythonic():
    py = get_parser("pythonic")
    out = py.extract("[get_weather(city='San Francisco', metric='celsius')]")
    assert _calls(out) == [("get_weather", {"city": "San Francisco", "metric": "celsius"})] and out.content is None
    out = py.extract("[register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, "
                     "role=None, passed_test=True, aliases=['John', 'Johnny']), get_weather(city='LA')]")
    assert _calls(out) == [("register_user", {"name": "John Doe", "age": 37, "address": {"city": "San Francisco",
                                                                                          "state": "CA"},
                                              "role": None, "passed_test": True, "aliases": ["John", "Johnny"]}),
                           ("get_weather", {"city": "LA"})]
    assert json.loads(py.extract("[f(flag=true, none=null, n=-2)]").calls[0].arguments) == \
        {"flag": True, "none": None, "n": -2}
    for text in ("Hello", "[1, 2]", "[f(x)]", "[f(a=g())]", "[f(a=1)", "[]"):
        assert py.extract(text).calls == () and py.extract(text).content == text


def _stream(answer: ToolAnswer, text: str, step: int) -> tuple[str, list[ToolCallDelta], str | None]:
    content, calls, reason = "", [], None
    pieces = [text[i:i + step] for i in range(0, len(text), step)] or [""]
    for i, piece in enumerate(pieces):
        final = i == len(pieces) - 1
        delta, reason = answer.delta(piece, final, "stop" if final else None)
        content += delta.content
        calls += delta.calls
    return content, calls, reason


AUTO_CASES = [("hermes", "Let me check. " + HERMES_TWO), ("hermes", "no calls <tool_ here"),
              ("hermes", "a <tool_call>{broken"),
              ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"a": 1}}'),
              ("llama3_json", "plain words {not json"), ("pythonic", "[f(a=1), g(b='x')]"), ("pythonic", "[not a call")]


@pytest.mark.parametrize(("parser", "text"), AUTO_CASES)
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_streamed_answer_is_the_whole_answer(parser, text, step):
    request = ToolRequest(({"type": "function", "function": {"name": "f"}},), "auto")
    whole = ToolAnswer(request, get_parser(parser)).whole(text, "stop")
    content, calls, reason = _stream(ToolAnswer(request, get_parser(parser)), text, step)
    assert content == (whole.content or "")
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.calls]
    assert [c.index for c in calls] == list(range(len(calls)))
    assert all(c.id.startswith("chatcmpl-tool-") for c in calls)  # (each a function call: the JSON's type, see
    # test_http_tools.py)
    assert reason == whole.finish_reason == ("tool_calls" if whole.calls else "stop")


def test_content_before_a_call_streams_before_the_answer_ends():
    answer = ToolAnswer(ToolRequest(({"type": "function", "function": {"name": "f"}},), "auto"), get_parser("hermes"))
    assert answer.delta("Sure <tool", False, None)[0] == Delta("Sure ")  # "<tool" may start a call: held
    assert answer.delta('_call>{"name": "f", "arguments": {}}</tool_call>', False, None)[0] == Delta()  # nothing
    delta, reason = answer.delta("", True, "stop")
    assert (delta.calls[0].name, delta.calls[0].arguments) == ("f", "{}") and reason == "tool_calls"


def test_parallel_false_keeps_the_first_call():
    request = ToolRequest(({"type": "function", "function": {"name": "get_current_weather"}},), "auto", parallel=False)
    assert len(ToolAnswer(request, get_parser("hermes")).whole(HERMES_TWO, "stop").calls) == 1


@pytest.mark.parametrize("name, text", [
    ("hermes", "<tool_call>" + "[" * 1500),
    ("hermes", '<tool_call>{"name": "f", "arguments": ' + "[" * 1500 + "]" * 1500 + "}</tool_call>"),
    ("llama3_json", '{"name": "f", "arguments": ' + "[" * 1500 + "]" * 1500 + "}"),
])
def test_a_call_nested_past_the_json_cap_is_content(name, text):
    """Issue 40 row 3: a model's output that a parser would read as deep JSON (the recursion past Python's limit, a
    500 before) is no call: the whole answer is content, whole and streamed."""
    parser = get_parser(name)
    assert parser.extract(text).calls == () and parser.extract(text).content == text
    answer = ToolAnswer(ToolRequest(({"type": "function", "function": {"name": "f"}},), "auto"), parser)
    streamed = [answer.delta(text[i:i + 100], i + 100 >= len(text), None) for i in range(0, len(text), 100)]
    assert "".join(d.content for d, _ in streamed) == text
    assert not any(d.calls for d, _ in streamed)


def test_a_required_answer_nested_past_the_json_cap_is_content():
    answer = ToolAnswer(ToolRequest(({"type": "function", "function": {"name": "f"}},), "required"))
    text = "[" * 1500 + "]" * 1500
    whole = answer.whole(text, "stop")
    assert whole.calls == () and whole.content == text
