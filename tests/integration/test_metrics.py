"""Prometheus metrics of both services, scraped over HTTP: the counters move by what the requests imply."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from app.launch import Service, start_stack
from app.scrape import Samples, metrics_address, scrape, value
from clients import SpliceClient, SpliceClientError
from tests.integration.conftest import MODEL

MAX_TOKENS = 5


def _metrics_address(service: Service) -> str:
    ready = [i for i, line in enumerate(service.output) if line.startswith(f"{service.name} serving on ")]
    hits = [i for i, line in enumerate(service.output) if line.startswith(f"{service.name} metrics on ")]
    assert hits and ready and hits[0] < ready[0], f"no metrics line before the ready line in {service.output}"
    return metrics_address(service)


def _settle(address: str, done: Callable[[Samples], bool], timeout: float = 15.0) -> Samples:
    """Scrapes until `done` holds (the engine thread records a step's counters just after emitting it)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(address)
        if done(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


@pytest.fixture(scope="module")
def metered_stack(tiny_dirs):
    engine, pre = start_stack(MODEL, engine_args=["--metrics-port", "0"], preprocessor_args=["--metrics-port", "0"])
    yield engine, pre
    pre.stop()
    engine.stop()


def test_counters_move_by_what_the_requests_imply(metered_stack, mixed_messages):
    engine, pre = metered_stack
    em, pm = _metrics_address(engine), _metrics_address(pre)
    e0, p0 = scrape(em), scrape(pm)

    with SpliceClient(pre.address, timeout=120) as client:
        chunks = list(client.chat(mixed_messages, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
        rows = client.model_info().vocab_rows
        with pytest.raises(SpliceClientError) as bad:
            list(client.complete([[1, 2, rows + 5]], max_tokens=2))
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].finish_reason == "length"
    generated = sum(len(c.token_ids) for c in chunks)
    assert generated == usage.completion_tokens == MAX_TOKENS
    parts = [p for m in mixed_messages for p in m["content"] if isinstance(p, dict)]
    n_images = sum(p["type"] == "image" for p in parts)
    n_embeds = sum(p["type"] == "prompt_embeds" for p in parts)

    def e_delta(samples: Samples, name: str, **labels: str) -> float:
        return value(samples, name, **labels) - value(e0, name, **labels)

    def p_delta(samples: Samples, name: str, **labels: str) -> float:
        return value(samples, name, **labels) - value(p0, name, **labels)

    def gen_delta(samples: Samples, name: str, **labels: str) -> float:
        """Over the engine's generate methods: the stream, GenerateWhole for a request that fits in one message, and
        Multiplex for such a request on the preprocessor's shared stream (each of its calls counted)."""
        return sum(e_delta(samples, name, service="splice.v1.Engine", method=m, **labels)
                   for m in ("Generate", "GenerateWhole", "Multiplex"))

    e1 = _settle(em, lambda s: e_delta(s, "splice_engine_generation_tokens_total") >= generated
                 and gen_delta(s, "splice_rpc_requests_total", code="OK") >= 1)
    chat = {"service": "splice.v1.Preprocessor", "method": "Chat"}
    complete = {"service": "splice.v1.Preprocessor", "method": "Complete"}
    p1 = _settle(pm, lambda s: p_delta(s, "splice_rpc_requests_total", **complete, code="INVALID_ARGUMENT") >= 1)

    # engine: tokens, finish reasons, one prefill then one decode step per further token, batch size 1
    assert e_delta(e1, "splice_engine_generation_tokens_total") == generated
    assert e_delta(e1, "splice_engine_prompt_tokens_total") == usage.prompt_tokens
    assert e_delta(e1, "splice_engine_requests_finished_total", finish_reason="length") == 1
    assert e_delta(e1, "splice_engine_requests_finished_total", finish_reason="stop") == 0
    assert e_delta(e1, "splice_engine_prefill_batch_size_count") == 1
    assert e_delta(e1, "splice_engine_decode_batch_size_count") == generated - 1
    assert e_delta(e1, "splice_engine_decode_batch_size_sum") == generated - 1
    assert e_delta(e1, "splice_engine_step_duration_seconds_count", phase="decode") == generated - 1
    assert e_delta(e1, "splice_engine_step_duration_seconds_count", phase="prefill") == 1
    assert e_delta(e1, "splice_engine_time_to_first_token_seconds_count") == 1
    assert value(e1, "splice_engine_num_requests_running") == 0
    assert value(e1, "splice_engine_num_requests_waiting") == 0
    assert gen_delta(e1, "splice_rpc_requests_total", code="OK") == 1
    assert gen_delta(e1, "splice_rpc_duration_seconds_count") == 1  # the bad one never reached it
    assert not any(name.startswith("splice_preprocessor_") for name, _ in e1)

    # preprocessor: one Chat OK, one Complete INVALID_ARGUMENT; the Chat's prompt, parts and latencies
    assert p_delta(p1, "splice_rpc_requests_total", **chat, code="OK") == 1
    assert p_delta(p1, "splice_rpc_requests_total", **complete, code="INVALID_ARGUMENT") == 1
    assert p_delta(p1, "splice_rpc_requests_total", **complete, code="OK") == 0
    assert p_delta(p1, "splice_preprocessor_prompt_tokens_sum", endpoint="chat") == usage.prompt_tokens
    assert p_delta(p1, "splice_preprocessor_prompt_tokens_count", endpoint="chat") == 1
    assert p_delta(p1, "splice_preprocessor_normalize_duration_seconds_count", endpoint="chat") == 1
    assert p_delta(p1, "splice_preprocessor_normalize_duration_seconds_count", endpoint="complete") == 0
    assert p_delta(p1, "splice_preprocessor_request_images_sum", endpoint="chat") == n_images
    assert p_delta(p1, "splice_preprocessor_request_prompt_embeds_parts_sum", endpoint="chat") == n_embeds
    assert p_delta(p1, "splice_preprocessor_time_to_first_token_seconds_count", endpoint="chat") == 1
    assert p_delta(p1, "splice_preprocessor_e2e_request_latency_seconds_count", endpoint="chat") == 1
    ttft = p_delta(p1, "splice_preprocessor_time_to_first_token_seconds_sum", endpoint="chat")
    e2e = p_delta(p1, "splice_preprocessor_e2e_request_latency_seconds_sum", endpoint="chat")
    assert 0 < ttft <= e2e
    assert value(p1, "splice_preprocessor_engine_connected") == 1
    assert not any(name.startswith("splice_engine_") for name, _ in p1)
