"""Issue 40 on real processes (engine + preprocessor on tiny-text, both faces): clients that hold a stream open and
never read it (row 9) are paused on the engine once they are --max-unread-tokens behind, generate nothing more while
another user's request runs, and are aborted when they disconnect; a request of more choices than
--max-seqs-per-request is refused naming the flag (row 12)."""

from __future__ import annotations

import json
import time

import grpc
import httpx
import pytest

from app.launch import start_stack
from app.scrape import scrape, total, value
from splice.v1 import preprocessor_pb2, preprocessor_pb2_grpc
from tests.harness.hostile_soak import silent_reader

MODEL = "tiny-text"
GUARD = 300.0  # seconds: a hang guard, not a timing assertion
CHOICES = 4  # n of each reader that never reads
MAX_SEQS = 8  # --max-seqs-per-request


@pytest.fixture(scope="module")
def stack(tiny_dirs):
    engine, pre = start_stack(MODEL, http_port=0, engine_args=[
        "--metrics-port", "0", "--max-unread-tokens", "64", "--unread-timeout", "3600",
        "--max-seqs-per-request", str(MAX_SEQS)])
    yield engine, pre
    pre.stop()
    engine.stop()


def _wait(what: str, predicate) -> None:
    deadline = time.monotonic() + GUARD
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def _engine(engine, name: str) -> float:
    return value(scrape(engine), name)


def test_readers_that_never_read_are_paused_and_cost_nothing_while_others_are_served(stack):
    engine, pre = stack
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "stream": True, "n": CHOICES,
            "max_tokens": 2000, "ignore_eos": True, "logprobs": True, "top_logprobs": 20}
    sockets = [silent_reader(pre.http_address, body) for _ in range(2)]
    # (gRPC's client reads ahead as far as its window grows: BDP probing off keeps it at 64 KiB, as a client that
    # reads nothing would leave it)
    channel = grpc.insecure_channel(pre.address, options=[("grpc.http2.bdp_probe", 0)])
    request = preprocessor_pb2.ChatRequest(messages=[preprocessor_pb2.ChatMessage(role="user", text="Tell me")])
    request.sampling.n, request.sampling.max_tokens, request.sampling.ignore_eos = CHOICES, 2000, True
    request.sampling.logprobs, request.sampling.top_logprobs = True, 20
    silent_grpc = preprocessor_pb2_grpc.PreprocessorStub(channel).Chat(request, timeout=GUARD)  # never read
    try:
        readers = 3 * CHOICES
        _wait("every sequence of the silent readers paused",
              lambda: _engine(engine, "splice_engine_num_requests_paused") == readers)
        generated = total(scrape(engine), "splice_engine_generation_tokens_total")
        with httpx.Client(base_url=f"http://{pre.http_address}", timeout=GUARD) as http, http.stream(
                "POST", "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}) as answer:
            events = [line for line in answer.iter_lines() if line.startswith("data: {")]
        assert answer.status_code == 200
        assert json.loads(events[-1][6:])["usage"]["completion_tokens"] == 12
        # the paused readers made no token meanwhile: the counter grew by the other user's only
        assert total(scrape(engine), "splice_engine_generation_tokens_total") == generated + 12
        assert _engine(engine, "splice_engine_num_requests_paused") == readers
    finally:
        for sock in sockets:
            sock.close()
        silent_grpc.cancel()
        channel.close()
    _wait("the readers that went away aborted", lambda: _engine(engine, "splice_engine_num_requests_running") == 0)
    assert _engine(engine, "splice_engine_num_requests_paused") == 0


def test_a_request_of_more_choices_than_max_seqs_per_request_is_refused_naming_the_flag(stack):
    pre = stack[1]
    with httpx.Client(base_url=f"http://{pre.http_address}", timeout=GUARD) as http:
        for stream in (False, True):
            answer = http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": MAX_SEQS + 1,
                "stream": stream})
            assert answer.status_code == 400, answer.text
            assert "--max-seqs-per-request" in answer.json()["error"]["message"]
        assert http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                       "max_tokens": 2, "n": MAX_SEQS}).status_code == 200
    with grpc.insecure_channel(pre.address) as channel:
        request = preprocessor_pb2.ChatRequest(messages=[preprocessor_pb2.ChatMessage(role="user", text="Hi")])
        request.sampling.n, request.sampling.max_tokens = MAX_SEQS + 1, 2
        with pytest.raises(grpc.RpcError) as err:
            list(preprocessor_pb2_grpc.PreprocessorStub(channel).Chat(request, timeout=GUARD))
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "--max-seqs-per-request" in err.value.details()
