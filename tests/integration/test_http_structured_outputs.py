"""Structured outputs end to end through the official `openai` SDK against real processes, on the random-weight tiny
text model sampled at temperature 1: every json_schema / json_object answer parses and follows its schema, choice and
regex answers match exactly, each ends with finish_reason stop (a `length` finish fails the test); bad specs and
competing constraints are 400s naming them; a grammar holds with a picture in the request; a constrained stream closed
by the client frees its row (the engine's running gauge back to 0) and constrained requests are served after it."""

from __future__ import annotations

import base64
import io
import json
import math
import re
import time

import jsonschema
import openai
import pytest

from app.demo import sample_picture
from app.scrape import scrape, value
from clients import SpliceClient
from tests.integration.conftest import API_KEY, MODEL

MSGS = [{"role": "user", "content": "Describe a thing."}]
SCHEMA = {"type": "object", "properties": {
    "colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer", "minimum": 0, "maximum": 9},
    "ok": {"type": "boolean"}, "tag": {"type": "string", "maxLength": 5}},
    "required": ["colour", "count", "ok", "tag"], "additionalProperties": False}
SEEDS = range(3)
ROOM = 120  # max_tokens: far more than any answer of these bounded schemas needs


def _json(text: str):
    return json.loads(text, strict=False)  # (a random model's strings may hold raw control characters)


def _ask(client, seed: int, **fields):
    reply = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=seed, max_tokens=ROOM,
                                           **fields)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    return choice.message.content


@pytest.mark.parametrize("seed", SEEDS)
def test_json_schema_and_json_object_answers_parse_and_follow(client, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    jsonschema.validate(_json(_ask(client, seed, response_format=fmt)), SCHEMA)
    # (json_object is unbounded: a random model's strings may run to max_tokens; test_real_model.py checks it)
    jsonschema.validate(_json(_ask(client, seed, extra_body={"guided_json": SCHEMA})), SCHEMA)


@pytest.mark.parametrize("seed", SEEDS)
def test_choice_regex_and_grammar_answers_match_exactly(client, seed):
    choices = ["Paris", "Lyon", "Nice"]
    assert _ask(client, seed, extra_body={"structured_outputs": {"choice": choices}}) in choices
    assert _ask(client, seed, extra_body={"guided_choice": choices}) in choices
    assert re.fullmatch(r"\d{3}-[a-z]{2}", _ask(client, seed, extra_body={"structured_outputs": {
        "regex": r"\d{3}-[a-z]{2}"}}))
    grammar = 'root ::= "A" ("B" | "C")'
    assert _ask(client, seed, extra_body={"structured_outputs": {"grammar": grammar}}) in ("AB", "AC")


def test_completions_and_streaming_follow_the_schema(client):
    reply = client.completions.create(model=MODEL, prompt="A thing:", temperature=1.0, seed=4, max_tokens=ROOM,
                                      extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                          "name": "t", "schema": SCHEMA}}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(_json(reply.choices[0].text), SCHEMA)
    stream = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=5, max_tokens=ROOM,
                                            stream=True, extra_body={"structured_outputs": {"json": SCHEMA}})
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(_json("".join(c.choices[0].delta.content or "" for c in chunks)), SCHEMA)


def test_max_tokens_stop_strings_and_logprobs_with_a_grammar(client):
    cut = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=1, max_tokens=3,
                                         extra_body={"guided_json": SCHEMA})  # (4 required keys: more than 3 tokens)
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content.startswith("{")
    stopped = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=1, max_tokens=ROOM,
                                             stop=["-"], extra_body={"structured_outputs": {"regex": r"ab-cd"}})
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].message.content == "ab"
    forced = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=1, max_tokens=ROOM,
                                            logprobs=True, top_logprobs=5, extra_body={"guided_choice": ["zz"]})
    assert forced.choices[0].message.content == "zz"
    # logprobs are of the masked distribution (vLLM's): the few tokens the grammar allows hold all the mass, and
    # the rest are -inf (-9999 in JSON)
    for step in forced.choices[0].logprobs.content:
        assert sum(math.exp(t.logprob) for t in step.top_logprobs if t.logprob > -9999) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(("fields", "named"), [
    ({"extra_body": {"structured_outputs": {"regex": "(ab"}}}, "structured_outputs.regex: structured output regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "response_format: structured output json is not valid"),
    ({"extra_body": {"guided_grammar": "root ::= missing"}}, "guided_grammar: structured output grammar"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}},
     "only one kind of structured output constraint may be set"),
    ({"extra_body": {"structured_outputs": {"choice": []}}}, "structured_outputs.choice must be a nonempty list"),
    ({"extra_body": {"guided_regex": "a" * 70000}}, "at most 65536"),
])
def test_bad_specs_are_400s_naming_them(client, fields, named):
    with pytest.raises(openai.BadRequestError, match=re.escape(named)):
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=4, **fields)
    assert _ask(client, 0, extra_body={"guided_choice": ["still", "serving"]}) in ("still", "serving")


def test_the_grpc_client_sends_the_same_constraint(http_stack):
    with SpliceClient(http_stack[1].address, timeout=60, api_key=API_KEY) as grpc_client:
        text = "".join(c.text for c in grpc_client.chat(MSGS, temperature=1.0, seed=2, max_tokens=ROOM,
                                                        structured_outputs={"regex": r"[xy]{4}"}))
        assert re.fullmatch(r"[xy]{4}", text)
        with pytest.raises(Exception, match="structured output regex is not valid"):
            list(grpc_client.chat(MSGS, max_tokens=4, guided_regex="(x"))


def test_every_choice_of_n_follows_the_schema(client):
    # (seeds 11..13: seed 10's answer holds a surrogate code point in UTF-8, which xgrammar's strings admit as one
    # character, as vLLM's do, and Python decodes as three U+FFFD: maxLength would count three)
    reply = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=11, max_tokens=ROOM, n=3,
                                           extra_body={"structured_outputs": {"json": SCHEMA}})
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(_json(choice.message.content), SCHEMA)


def _with_picture(text: str) -> list[dict]:
    buf = io.BytesIO()
    sample_picture(80, 40).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


@pytest.mark.parametrize("seed", range(2))
def test_a_grammar_holds_with_a_picture_in_the_request(client, seed):
    """The stack's model (tiny-idefics3) is a vision model: the image's rows are merged into the prompt, and the
    constrained answer still follows its constraint."""
    words = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "What is in it?"}],
                                           max_tokens=1).usage.prompt_tokens

    def ask(**fields):
        reply = client.chat.completions.create(model=MODEL, messages=_with_picture("What is in it?"), temperature=1.0,
                                               seed=seed, max_tokens=ROOM, **fields)
        assert reply.choices[0].finish_reason == "stop", reply.choices[0]
        assert reply.usage.prompt_tokens > words + 8  # (the picture's tokens are in the prompt)
        return reply.choices[0].message.content

    assert ask(extra_body={"structured_outputs": {"choice": ["cat", "dog", "bird"]}}) in ("cat", "dog", "bird")
    assert re.fullmatch(r"[a-f]{2}-\d", ask(extra_body={"structured_outputs": {"regex": r"[a-f]{2}-\d"}}))
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
    jsonschema.validate(_json(ask(response_format=fmt)), SCHEMA)


def _settle(engine, done, timeout: float = 30.0):
    """Scrapes until `done` holds (the engine records a step's counters just after the step's outputs)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(engine)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_a_closed_constrained_stream_frees_its_row_and_constraints_keep_being_served(client, http_stack):
    engine = http_stack[0]
    finished, running = "splice_engine_requests_finished_total", "splice_engine_num_requests_running"
    before = scrape(engine)
    # the regex admits nothing but 1500 x's: the row cannot end on its own before the client closes it
    stream = client.chat.completions.create(model=MODEL, messages=MSGS, stream=True, temperature=1.0, max_tokens=2000,
                                            extra_body={"structured_outputs": {"regex": "x{1500}"}})
    text = ""
    for chunk in stream:
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        if len(text) >= 3:
            break
    assert set(text) == {"x"} and value(scrape(engine), running) == 1
    stream.close()
    after = _settle(engine, lambda s: value(s, finished, finish_reason="abort")
                    > value(before, finished, finish_reason="abort") and value(s, running) == 0)
    assert value(after, finished, finish_reason="abort") - value(before, finished, finish_reason="abort") == 1
    assert value(after, running) == 0
    # the same spec again, cut short, and another constraint: both served and followed
    cut = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=4,
                                         extra_body={"structured_outputs": {"regex": "x{1500}"}})
    assert cut.choices[0].finish_reason == "length" and set(cut.choices[0].message.content) == {"x"}
    assert _ask(client, 3, extra_body={"guided_choice": ["after", "close"]}) in ("after", "close")


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_inside_a_json_schema_answer_cuts_it_and_max_tokens_says_length(client, stream):
    """vLLM's order: the grammar picks the tokens, the stop string then ends the text (without the stop string); a
    json_schema answer cut by max_tokens finishes with length, whole or streamed."""
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}

    def ask(**fields) -> tuple[str, str]:
        reply = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=6, stream=stream,
                                               **{"response_format": fmt, **fields})
        if not stream:
            return reply.choices[0].message.content, reply.choices[0].finish_reason
        chunks = [c for c in reply if c.choices]
        return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason

    strict = {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}}  # no free whitespace
    text, reason = ask(max_tokens=ROOM, stop=[',"count"'], response_format=None, extra_body=strict)
    assert reason == "stop" and re.fullmatch(r'\{"colour":"(red|green|blue)"', text), text
    text, reason = ask(max_tokens=3)
    assert reason == "length" and text.startswith("{"), text
