"""Graceful drain on SIGTERM: health NOT_SERVING, new calls UNAVAILABLE, running streams finish (whole) within
--drain-grace, then the process exits by itself; for the preprocessor and for the engine."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.launch import start_stack
from clients import SpliceClient, SpliceClientError
from tests.integration.conftest import MODEL

TOKENS = 1500  # long enough that the stream outlives the health checks below, however fast the machine
LONG = {"temperature": 0.0, "max_tokens": TOKENS, "ignore_eos": True}
HI = [{"role": "user", "content": "Tell me a story."}]


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status


@pytest.mark.parametrize("who", ["preprocessor", "engine"])
def test_sigterm_drains_running_streams(tiny_dirs, who):
    engine, pre = start_stack(MODEL, engine_args=["--drain-grace", "60"], preprocessor_args=["--drain-grace", "60"])
    target = pre if who == "preprocessor" else engine
    try:
        with SpliceClient(pre.address, timeout=120) as client:
            stream = client.chat(HI, **LONG)
            first = next(stream)
            target.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            assert _health(target.address) == health_pb2.HealthCheckResponse.NOT_SERVING
            if who == "preprocessor":
                with pytest.raises(SpliceClientError) as refused:
                    list(client.chat(HI, max_tokens=1))
                assert refused.value.code == grpc.StatusCode.UNAVAILABLE, refused.value
            rest = list(stream)
        chunks = [first, *rest]
        assert chunks[-1].finish_reason == "length"
        assert sum(len(c.token_ids) for c in chunks) == chunks[-1].usage.completion_tokens == TOKENS
        assert target.proc.wait(30) == 0
    finally:
        pre.stop()
        engine.stop()
