"""/v1/completions serves one choice per prompt, as vLLM does: each prompt_embeds item, then each prompt (a
string, token IDs, or OpenAI's list of either), each its own engine request; choices are indexed in that
order, streamed chunks carry their choice's index, and usage sums over the choices."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.demo import vllm_base64
from preprocessor.limits import Limits
from tests.preprocessor.http_face import http_face
from tests.preprocessor.pp_factories import rows

MODEL = "tiny-text"
REPLY = 8  # tokens the stand-in engine answers with ("All good.", byte-level)


def _events(text: str) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def _complete(face, **body) -> dict:
    r = await face.http.post("/v1/completions", json={"max_tokens": 8, **body})
    assert r.status_code == 200, r.text
    return r.json()


async def test_each_prompt_embeds_item_is_its_own_choice(tiny_dirs, tiny):
    hidden = tiny[MODEL][1].hidden_size
    a, b = rows(3, hidden, seed=1), rows(5, hidden, seed=2)
    async with http_face(tiny_dirs, tiny, MODEL) as face:
        body = await _complete(face, prompt_embeds=[vllm_base64(a), vllm_base64(b)], request_id="batch")
        assert [c["index"] for c in body["choices"]] == [0, 1]
        assert all(c["text"] == "All good." and c["prompt_logprobs"] is None for c in body["choices"])
        assert body["usage"] == {"prompt_tokens": 8, "completion_tokens": 2 * REPLY, "total_tokens": 8 + 2 * REPLY,
                                 "prompt_tokens_details": None, "completion_tokens_details": None}
        # one engine request per item, in order, each holding only its own rows
        requests = sorted(face.engine.requests, key=lambda r: r.request_id)
        assert [r.request_id for r in requests] == ["batch-0", "batch-1"]
        assert [r.prompt_len for r in requests] == [3, 5]
        assert all(len(r.embed_spans) == 1 for r in requests)


async def test_prompt_and_prompt_embeds_are_two_prompts_embeds_first(tiny_dirs, tiny):
    files, info = tiny[MODEL]
    text_ids = files.tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    async with http_face(tiny_dirs, tiny, MODEL) as face:
        body = await _complete(face, prompt="Once upon a time", prompt_embeds=vllm_base64(rows(4, info.hidden_size)),
                               request_id="mixed")
        assert len(body["choices"]) == 2
        by_id = {r.request_id: r for r in face.engine.requests}
        assert by_id["mixed-0"].prompt_len == 4 and len(by_id["mixed-0"].embed_spans) == 1
        assert list(by_id["mixed-1"].token_ids) == text_ids and not by_id["mixed-1"].embed_spans
        assert body["usage"]["prompt_tokens"] == 4 + len(text_ids)


@pytest.mark.parametrize("prompt", [["Once upon", "a time"], [[40, 41, 42], [43, 44]]])
async def test_a_list_of_prompts_is_a_batch(tiny_dirs, tiny, prompt):
    tok = tiny[MODEL][0].tokenizer
    expected = [tok(p, add_special_tokens=False)["input_ids"] if isinstance(p, str) else p for p in prompt]
    async with http_face(tiny_dirs, tiny, MODEL) as face:
        body = await _complete(face, prompt=prompt, request_id="list")
        assert [c["index"] for c in body["choices"]] == [0, 1]
        by_id = {r.request_id: list(r.token_ids) for r in face.engine.requests}
        assert [by_id["list-0"], by_id["list-1"]] == expected
        assert body["usage"]["prompt_tokens"] == sum(map(len, expected))
        # one prompt (a string or one ID list) keeps the request's own ID
        await _complete(face, prompt=prompt[:1], request_id="one")
        assert [r.request_id for r in face.engine.requests][-1] == "one"


async def test_a_batch_streams_each_choice_with_its_index_and_one_usage(tiny_dirs, tiny):
    hidden = tiny[MODEL][1].hidden_size
    async with http_face(tiny_dirs, tiny, MODEL) as face:
        r = await face.http.post("/v1/completions", json={
            "prompt": "Once upon", "prompt_embeds": [vllm_base64(rows(2, hidden))], "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}})
        assert r.status_code == 200, r.text
        events = _events(r.text)
        texts: dict[int, str] = {0: "", 1: ""}
        finishes = []
        for e in events[:-1]:
            (choice,) = e["choices"]
            texts[choice["index"]] += choice["text"]
            if choice["finish_reason"]:
                finishes.append(choice["index"])
        assert texts == {0: "All good.", 1: "All good."}
        assert sorted(finishes) == [0, 1]
        usage = events[-1]["usage"]
        assert events[-1]["choices"] == [] and usage["completion_tokens"] == 2 * REPLY
        assert usage["prompt_tokens"] == 2 + len(tiny[MODEL][0].tokenizer("Once upon")["input_ids"])


async def test_one_bad_prompt_refuses_the_batch_before_any_reaches_the_engine(tiny_dirs, tiny):
    info = tiny[MODEL][1]
    async with http_face(tiny_dirs, tiny, MODEL, limits=Limits(max_prompts=3)) as face:
        r = await face.http.post("/v1/completions", json={"prompt": [[1, 2], [1, info.vocab_rows + 7]]})
        assert r.status_code == 400 and str(info.vocab_rows + 7) in r.json()["error"]["message"]
        r = await face.http.post("/v1/completions", json={"prompt": ["a", "b", "c", "d"]})
        assert r.status_code == 400 and "4 prompts; at most 3" in r.json()["error"]["message"]
        r = await face.http.post("/v1/completions", json={"prompt_embeds": ["not base64!"], "prompt": "x"})
        assert r.status_code == 400 and "prompt_embeds[0]" in r.json()["error"]["message"]
        assert face.engine.requests == []


async def test_a_client_that_goes_away_aborts_every_prompt_of_its_batch(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, MODEL, forever=True, delay=0.01) as face:
        body = {"prompt": ["Once upon", "a time"], "max_tokens": 2000, "stream": True, "request_id": "gone"}
        seen: set[int] = set()
        async with face.http.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    seen.add(json.loads(line.removeprefix("data: "))["choices"][0]["index"])
                if seen == {0, 1}:
                    break
        engine = face.engine
        while len(engine.cancelled_ids) < 2:
            await asyncio.wait_for(engine.cancelled.wait(), 10)
            engine.cancelled.clear()
        assert sorted(engine.cancelled_ids) == ["gone-0", "gone-1"]
