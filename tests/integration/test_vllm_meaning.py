"""vLLM's meaning through the whole stack (the real engine on a tiny model; bench/vs_vllm_api.py holds the same
against vLLM itself on the real model): an answer a stop token ends leaves the token's text out and names it in
stop_reason, on chat and completions, streamed and not, and over gRPC; the preprocessor's vLLM flags
--served-model-name and --enable-prompt-tokens-details (cached_tokens from the engine's prefix cache); max_tokens past
the context refused on both faces."""

from __future__ import annotations

import grpc
import httpx
import pytest

from app.launch import start_stack
from clients import SpliceClient, SpliceClientError

MODEL = "tiny-text"
NAMES = ("alias-a", "alias-b")
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def stack(tiny_dirs):
    engine, pre = start_stack(MODEL, http_port=0, engine_args=["--max-running-seqs", "4"],
                              preprocessor_args=["--served-model-name", *NAMES, "--enable-prompt-tokens-details"])
    yield engine, pre
    pre.stop()
    engine.stop()


@pytest.fixture(scope="module")
def http(stack):
    with httpx.Client(base_url=f"http://{stack[1].http_address}", timeout=120) as client:
        yield client


def _events(resp: httpx.Response) -> list[dict]:
    import json

    return [json.loads(line[6:]) for line in resp.text.split("\n") if line.startswith("data: {")]


def _stopper(ids: list[int]) -> tuple[int, int]:
    """A token of a greedy answer to stop on (its first occurrence at index k >= 2) and k."""
    k = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])
    return ids[k], k


def test_a_stop_token_ends_the_answer_as_vllms_does(http, stack):
    chat = {"model": NAMES[1], "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12,
            "return_token_ids": True, **GREEDY}
    plain = http.post("/v1/chat/completions", json=chat).json()["choices"][0]
    token, k = _stopper(plain["token_ids"])
    want_ids = plain["token_ids"][:k + 1]
    want_text = http.post("/detokenize", json={"tokens": plain["token_ids"][:k]}).json()["prompt"]
    stopped = http.post("/v1/chat/completions", json={**chat, "stop_token_ids": [token]}).json()["choices"][0]
    assert stopped["token_ids"] == want_ids and stopped["message"]["content"] == want_text
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == token
    events = _events(http.post("/v1/chat/completions", json={**chat, "stop_token_ids": [token], "stream": True}))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == want_text
    assert events[-1]["choices"][0]["stop_reason"] == token
    kept = http.post("/v1/chat/completions", json={**chat, "stop_token_ids": [token],
                                                   "include_stop_str_in_output": True}).json()["choices"][0]
    assert kept["message"]["content"] == http.post("/detokenize", json={"tokens": want_ids}).json()["prompt"]

    complete = {"model": NAMES[0], "prompt": "Once upon", "max_tokens": 12, "return_token_ids": True, **GREEDY}
    plain = http.post("/v1/completions", json=complete).json()["choices"][0]
    token, k = _stopper(plain["token_ids"])
    want_text = http.post("/detokenize", json={"tokens": plain["token_ids"][:k]}).json()["prompt"]
    for stream in (False, True):
        resp = http.post("/v1/completions", json={**complete, "stop_token_ids": [token], "stream": stream})
        choices = [e["choices"][0] for e in _events(resp)] if stream else resp.json()["choices"]
        assert "".join(c["text"] for c in choices) == want_text and choices[-1]["stop_reason"] == token

    with SpliceClient(stack[1].address, timeout=60) as client:
        chunks = list(client.complete(["Once upon"], max_tokens=12, stop_token_ids=[token], **GREEDY))
    assert chunks[-1].stop_token_id == token and "".join(c.text for c in chunks) == want_text


def test_served_names_and_cached_tokens(http):
    assert [m["id"] for m in http.get("/v1/models").json()["data"]] == list(NAMES)
    assert http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi"}).status_code == 404
    prompt = " ".join(["red green blue"] * 30)  # several blocks of the prefix cache
    usages = [http.post("/v1/completions", json={"model": NAMES[1], "prompt": prompt, "max_tokens": 2, **GREEDY})
              .json()["usage"] for _ in range(2)]
    assert usages[0]["prompt_tokens_details"] == {"cached_tokens": 0}
    cached = usages[1]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < usages[1]["prompt_tokens"], usages  # whole blocks, never the last position


def test_max_tokens_past_the_context_is_refused_on_both_faces(http, stack):
    whole = http.get("/v1/models").json()["data"][0]["max_model_len"]
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": whole + 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    with SpliceClient(stack[1].address, timeout=60) as client, pytest.raises(SpliceClientError) as err:
        list(client.complete(["Hi"], max_tokens=whole + 1))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in str(err.value)
