"""`splice up --engine-args="--simulate-forward-ms 1"`: the whole stack (both gRPC hops, the detokenizer, HTTP) around
a simulated forward gives the simulated model's tokens (engine/simulate.py `simulated_next`, chained from the last
prompt token) over gRPC and HTTP alike, and a stream cancelled mid-way frees its engine row."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from app.scrape import scrape, value
from clients import SpliceClient
from engine.simulate import simulated_chain
from tests.harness.up import Up
from tests.integration.test_cli import free_port

IDS = [45, 97, 123, 260, 333, 41, 512, 77]
N = 12
LONG = 2000  # a stream far longer than it is let run before it is cancelled (tiny-text: 2048 positions)
GREEDY = {"temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def simulated_up(tiny_dirs):
    metrics = free_port()
    up = Up("--port", "0", "--engine-port", "0", "--http-port", "0",
            f"--engine-args=--simulate-forward-ms 1 --max-running-seqs 8 --metrics-port {metrics}", model="tiny-text")
    try:
        up.wait_ready()
        http = up.read_until("http serving on").split()[-1]
        yield up, http, f"127.0.0.1:{metrics}"
    finally:
        up.kill()


def _settle(metrics: str, done, timeout: float = 30.0):
    """Engine samples once `done` holds (the engine records each step's state just after scheduling it)."""
    deadline = time.monotonic() + timeout
    while not done(samples := scrape(metrics)):
        assert time.monotonic() < deadline, "the engine's state never got there"
        time.sleep(0.05)
    return samples


def test_the_simulated_tokens_over_grpc_and_http(simulated_up):
    up, http, _ = simulated_up
    with SpliceClient(up.address, timeout=60) as client:
        vocab = client.model_info().vocab_rows
        want = simulated_chain(IDS, N, vocab)
        got = [t for c in client.complete([IDS], max_tokens=N, **GREEDY) for t in c.token_ids]
        assert got == want
        chat_chunks = list(client.chat([{"role": "user", "content": "Count on."}], max_tokens=N, **GREEDY))
    with httpx.Client(base_url=f"http://{http}", timeout=60) as web:
        body = {"model": "tiny-text", "prompt": IDS, "max_tokens": N, "return_token_ids": True, **GREEDY}
        whole = web.post("/v1/completions", json=body)
        assert whole.status_code == 200, whole.text
        assert whole.json()["choices"][0]["token_ids"] == want
        streamed = []
        with web.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    streamed += json.loads(line[6:])["choices"][0].get("token_ids") or []
        assert streamed == want
        chat = web.post("/v1/chat/completions", json={
            "model": "tiny-text", "messages": [{"role": "user", "content": "Count on."}], "max_tokens": N,
            "return_token_ids": True, **GREEDY}).json()
    # the chat template's prompt, whatever it is, continues by the same rule on both faces
    assert chat["choices"][0]["token_ids"] == simulated_chain(chat["prompt_token_ids"], N, vocab)
    assert [t for c in chat_chunks for t in c.token_ids] == chat["choices"][0]["token_ids"]


@pytest.mark.parametrize("face", ["grpc", "http"])
def test_a_stream_cancelled_mid_way_frees_its_engine_row(simulated_up, face):
    up, http, metrics = simulated_up
    for _ in range(3):  # a stream that ran out before its close (a stalled test process) is tried again
        start = scrape(metrics)

        def ended(samples, reason: str, start=start) -> float:
            return value(samples, "splice_engine_requests_finished_total", finish_reason=reason) - value(
                start, "splice_engine_requests_finished_total", finish_reason=reason)

        if face == "grpc":
            with SpliceClient(up.address, timeout=60) as client:
                stream = client.complete([IDS], max_tokens=LONG, **GREEDY)
                got = [next(stream) for _ in range(3)]
                stream.close()  # cancels the call
        else:
            body = {"model": "tiny-text", "prompt": IDS, "max_tokens": LONG, "stream": True, **GREEDY}
            with httpx.Client(base_url=f"http://{http}", timeout=60) as web, \
                    web.stream("POST", "/v1/completions", json=body) as r:
                got = []
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        got.append(line)
                        if len(got) == 3:
                            break
        assert len(got) == 3
        # the row left the running batch, and why: cancelled before its tokens ran out (not finished by length)
        after = _settle(metrics, lambda s, ended=ended: value(s, "splice_engine_num_requests_running") == 0
                        and ended(s, "abort") + ended(s, "length") >= 1)
        if ended(after, "abort"):
            break
    assert (ended(after, "abort"), ended(after, "length")) == (1, 0)
    generated = value(after, "splice_engine_generation_tokens_total") - value(start,
                                                                              "splice_engine_generation_tokens_total")
    assert 3 <= generated < LONG
