"""A large JSON body is parsed off the event loop by preprocessor/http/body.py: the same value json.loads gives, its
collections counted as they are read (a field past its bound refused, naming it, before the rest of its entries
become objects), its nesting and its strings checked; and the admission charge counts the values a body holds."""

from __future__ import annotations

import json
import random

import pytest

from preprocessor.admission import Admission
from preprocessor.http.admission import PARSE_FACTOR, VALUE_BYTES
from preprocessor.http.body import INLINE_BODY_BYTES, MAX_BODY_DEPTH, Caps, parse_body
from preprocessor.http.json_body import json_bytes
from preprocessor.http.schemas import ParsedBody
from splice.errors import InvalidArgument
from tests.preprocessor.http_face import http_face
from tests.test_json_depth import random_json

CAPS = Caps({"logit_bias": (10, "the vocabulary"), "tools": (3, "the tool cap")}, default=(50, "the default"))


def test_it_reads_what_json_loads_reads():
    rng = random.Random(7)
    for _ in range(400):
        body = {"messages": [{"role": "user", "content": "hi"}], "x": random_json(rng)}
        for text in (json.dumps(body), json.dumps(body, indent=2), json.dumps(body, separators=(",", ":"))):
            parsed = parse_body(text, CAPS)
            assert parsed == json.loads(text) and isinstance(parsed, ParsedBody)
    assert parse_body('[1, 2.5e3, -0.5]', CAPS) == [1, 2.5e3, -0.5]
    assert parse_body(' {"a": [ ], "b": { }} ', CAPS) == {"a": [], "b": {}}


@pytest.mark.parametrize("text, named", [
    ('{"a": ', "ends early"), ('{"a" 1}', "':' was expected"), ('{"a": 1,}', "property name"),
    ('{"a": [1 2]}', "Expecting ',' delimiter at character 9"), ('{"a": 1} x', "extra data"),
    ('{"a": nul}', "a value was expected"), ('{"a": "x\x01"}', "Invalid control character at character 8"),
    ('{"a": "\\u12"}', "Invalid \\\\uXXXX escape"),
    ('{"a": [1, 2}', r"',' or '\]' was expected"),
])
def test_malformed_bodies_are_refused_as_not_json(text, named):
    with pytest.raises(InvalidArgument, match=rf"^the request body is not valid JSON \(.*{named}"):
        parse_body(text, CAPS)


def test_a_field_past_its_bound_is_refused_naming_it_before_the_rest_is_read():
    entries = ", ".join(f'"{i}": 1.0' for i in range(100_000))
    with pytest.raises(InvalidArgument, match=r"^logit_bias holds more than 10 entries \(at least 11\); the "
                                              r"vocabulary$"):
        parse_body('{"logit_bias": {' + entries + "}}", CAPS)
    ids = ", ".join(["7"] * 100_000)  # a flat array of numbers: counted from its text before it is parsed
    with pytest.raises(InvalidArgument, match=r"^tools holds more than 3 entries \(at least 100000\)"):
        parse_body('{"tools": [' + ids + "]}", CAPS)
    with pytest.raises(InvalidArgument, match=r"^x\[0\] holds more than 50 entries .*the default"):
        parse_body('{"x": [[' + ids + "]]}", CAPS)
    assert len(parse_body('{"logit_bias": {' + ", ".join(f'"{i}": 1' for i in range(10)) + "}}", CAPS)
               ["logit_bias"]) == 10


def test_nesting_and_lone_surrogates_are_refused_naming_where():
    deep = "[" * (MAX_BODY_DEPTH + 1) + "]" * (MAX_BODY_DEPTH + 1)
    with pytest.raises(InvalidArgument, match=rf"^the request body nests more than {MAX_BODY_DEPTH} levels .*"
                                              r"\(at tools\[0\]\[0\]"):
        parse_body('{"tools": [' + deep + "]}", CAPS)
    with pytest.raises(InvalidArgument, match=r"^messages\[0\]\.content holds a lone UTF-16 surrogate"):
        parse_body('{"messages": [{"content": "a\\ud800b"}]}', CAPS)


def test_whole_answers_are_encoded_in_pieces_as_jsonresponse_writes_them():
    from starlette.responses import JSONResponse

    rng = random.Random(5)
    for _ in range(100):
        value = {"choices": [{"logprobs": {"content": [random_json(rng) for _ in range(rng.choice([0, 3, 700]))]},
                              "n": {1: True, "k": [None]}}], "x": random_json(rng)}
        assert json_bytes(value) == JSONResponse(value).body


def test_prompt_logprobs_are_encoded_a_slice_of_positions_at_a_time(monkeypatch):
    """A long list of small items (a prompt's logprobs: a dict per position) is encoded SLICE items per json.dumps
    call, not walked item by item (7.5x the CPU of one call, all of it holding the GIL, while every other client's
    request waits on the preprocessor); a short list of large items (a request's choices) is still walked, and the
    bytes are JSONResponse's either way."""
    from starlette.responses import JSONResponse

    from preprocessor.http import json_body

    calls = []
    dumps = json_body._dumps
    monkeypatch.setattr(json_body, "_dumps", lambda v: calls.append(1) or dumps(v))
    rng = random.Random(6)
    positions = [None] + [{str(rng.randrange(1000)): {"logprob": -rng.random(), "rank": k + 1, "decoded_token": "é"}
                          for k in range(21)} for _ in range(1500)]
    big = [{"text": "x" * 10, "logprobs": {"content": [{"t": k} for k in range(3000)]}} for _ in range(2)]
    value = {"choices": [*big, {"prompt_logprobs": positions}], "prompt_logprobs": positions}
    assert json_bytes(value) == JSONResponse(value).body
    assert len(calls) < 200  # (walked item by item: more than 100,000)


async def test_a_large_body_is_parsed_off_the_loop_and_counted_by_its_values(tiny_dirs, tiny):
    """Over HTTP: a logit_bias past the vocabulary in a body larger than INLINE_BODY_BYTES is a 400 naming the field
    (body.py read it), and a body of more values than the byte cap can hold parsed is a 413 while it arrives."""
    _, info = tiny["tiny-text"]
    bias = {str(i): 1.0 for i in range(INLINE_BODY_BYTES // 8)}
    async with http_face(tiny_dirs, tiny) as face:
        r = await face.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                               "max_tokens": 2, "logit_bias": bias})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(
            f"logit_bias holds more than {info.vocab_rows} entries"), r.text
        ok = await face.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                                "max_tokens": 2, "user": "x" * INLINE_BODY_BYTES})
        assert ok.status_code == 200, ok.text
    cap = 4 << 20
    values = cap // VALUE_BYTES  # each value alone would pass the cap together, though the bytes are far below it
    body = ('{"prompt": "hi", "stop_token_ids": [' + ",".join(["1"] * values) + "]}").encode()
    assert len(body) * PARSE_FACTOR < cap
    async with http_face(tiny_dirs, tiny, admission=Admission(max_bytes=cap)) as face:
        r = await face.http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "JSON values" in r.json()["error"]["message"], r.text


def test_json_already_written_is_placed_as_it_is_wherever_it_lies():
    """A prompt's logprobs come written (RawJSON): on each of many choices (more than are walked item by item without
    sampling their size), small or large, the body's bytes are those of the same values as dicts."""
    from starlette.responses import JSONResponse

    from preprocessor.http.json_body import RawJSON

    rng = random.Random(7)
    for positions in (2, 300):
        plp = [None] + [{str(rng.randrange(1000)): {"logprob": -rng.random(), "rank": 1, "decoded_token": "é"}}
                        for _ in range(positions)]
        raw = RawJSON(("[", json.dumps(plp, ensure_ascii=False, separators=(",", ":"))[1:-1], "]"))
        for n in (1, 16, 300):
            body = json_bytes({"choices": [{"index": i, "prompt_logprobs": raw} for i in range(n)]})
            assert body == JSONResponse({"choices": [{"index": i, "prompt_logprobs": plp} for i in range(n)]}).body
