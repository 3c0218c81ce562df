"""Tool calling on real processes (engine + preprocessor on tiny-text, whose template renders tools, with
`--tool-call-parser hermes --enable-auto-tool-choice`), through the official `openai` SDK: the tools are in the
prompt the engine got, an answer is parsed the same streamed or not, and what vLLM refuses is a 400."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from app.launch import start_stack

MODEL = "tiny-text"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def base_url(tiny_dirs):
    engine, pre = start_stack(MODEL, http_port=0, engine_args=["--max-running-seqs", "4"],
                              preprocessor_args=["--tool-call-parser", "hermes", "--enable-auto-tool-choice"])
    yield f"http://{pre.http_address}"
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=120, max_retries=0) as c:
        yield c


def test_tools_are_in_the_prompt_the_engine_got(client, base_url):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=1,
                                           extra_body={"return_token_ids": True})
    ids = reply.model_extra["prompt_token_ids"]
    prompt = httpx.post(f"{base_url}/detokenize", json={"tokens": ids}, timeout=60).json()["prompt"]
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in prompt  # as the template's tojson writes it
    tokenized = httpx.post(f"{base_url}/tokenize", json={"messages": ASK, "tools": [WEATHER]}, timeout=60).json()
    assert tokenized["tokens"] == ids
    plain = httpx.post(f"{base_url}/tokenize", json={"messages": ASK}, timeout=60).json()["tokens"]
    assert len(plain) < len(ids)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_answer_is_parsed_the_same_streamed_or_not(client, seed):
    args = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "max_tokens": 24, "temperature": 1.0, "seed": seed}
    whole = client.chat.completions.create(**args).choices[0]
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(**args, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            calls.setdefault(d.index, ["", ""])
            calls[d.index][0] += d.function.name or ""
            calls[d.index][1] += d.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    assert content == (whole.message.content or "") and reason == whole.finish_reason
    assert [tuple(c) for c in calls.values()] == [(c.function.name, c.function.arguments)
                                                  for c in whole.message.tool_calls or []]
    # the same sampled answer with tool_choice "none" (the same prompt: tools are rendered) is the raw text
    raw = client.chat.completions.create(**args, tool_choice="none").choices[0].message.content
    if "<tool_call>" not in raw:
        assert whole.message.content == raw and not whole.message.tool_calls


def test_n_choices_are_parsed_each_the_same_streamed_or_not(client):
    args = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "max_tokens": 16, "temperature": 1.0, "seed": 7,
            "n": 2}
    whole = client.chat.completions.create(**args).choices
    content: dict[int, str] = {0: "", 1: ""}
    reasons: dict[int, str] = {}
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            content[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    assert [content[c.index] for c in whole] == [c.message.content or "" for c in whole]
    assert [reasons[c.index] for c in whole] == [c.finish_reason for c in whole]


def test_refusals_before_engine_time(client):
    with pytest.raises(openai.BadRequestError, match="'nope'"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="tool_choice must be one of"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="sometimes")
    # the service keeps serving
    assert client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2).choices[0].finish_reason


# tool_choice "required" and a named function are constrained by the call's JSON schema (preprocessor/tools/choice.py)
# through SamplingParams.structured.
BOUNDED = {"type": "function", "function": {"name": "set_alarm", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["hour", "label", "loud", "day"],
    "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                   "label": {"type": "string", "maxLength": 8}, "loud": {"type": "boolean"},
                   "day": {"enum": ["mon", "tue", "wed"]}}}}}


CITY = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"type": "string", "maxLength": 12}}}}}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "set_alarm"}}])
def test_constrained_choices_give_valid_calls_even_at_random(client, seed, choice):
    """Bounded schemas (a `length` finish would be a failure): with parallel_tool_calls false the answer holds one
    call, so even `required`'s list ends."""
    import jsonschema

    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[CITY, BOUNDED], tool_choice=choice,
                                           temperature=1.0, seed=seed, max_tokens=200, parallel_tool_calls=False)
    answer = reply.choices[0]
    assert answer.finish_reason == ("tool_calls" if choice == "required" else "stop")  # vLLM's (named: "stop")
    assert answer.message.tool_calls
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in (CITY, BOUNDED)}
    for call in answer.message.tool_calls:
        assert call.id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])
        if choice != "required":
            assert call.function.name == "set_alarm"
