"""Engine loss and cancellation, each on a stack of its own (they stop or saturate the engine)."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest

from clients import SpliceClient, SpliceClientError
from splice.launch import start, start_stack, wait_healthy
from tests.integration.conftest import MODEL

LONG = {"temperature": 0.0, "max_tokens": 1500, "ignore_eos": True}


def test_engine_killed_mid_stream_gives_unavailable_then_recovers(tiny_dirs):
    engine, pre = start_stack(MODEL)
    try:
        port = engine.address.rsplit(":", 1)[1]
        with SpliceClient(pre.address, timeout=120) as client:
            stream = client.chat([{"role": "user", "content": "Tell me a long story."}], **LONG)
            next(stream)  # streaming has begun
            engine.kill()
            killed_at = time.monotonic()
            with pytest.raises(SpliceClientError) as err:
                for _ in stream:
                    pass
            waited = time.monotonic() - killed_at
            assert err.value.code == grpc.StatusCode.UNAVAILABLE, err.value
            # "promptly": well inside the 120 s call deadline, i.e. not discovered by a timeout
            assert waited < 60, f"UNAVAILABLE only after {waited:.1f}s"

            engine = start("engine", ["--model", MODEL, "--host", "127.0.0.1", "--port", port])
            wait_healthy(engine.address)
            chunks = _retry_while(client, grpc.StatusCode.UNAVAILABLE, 60)
            assert chunks[-1].finish_reason in ("stop", "length")
    finally:
        pre.stop()
        engine.stop()


def test_frozen_engine_gives_unavailable_without_waiting_for_the_deadline(tiny_dirs):
    # SIGSTOP: the engine's connection stays open but nothing answers, like a hung host or a partition
    engine, pre = start_stack(MODEL)
    try:
        with SpliceClient(pre.address, timeout=300) as client:
            stream = client.chat([{"role": "user", "content": "Tell me a long story."}], **LONG)
            next(stream)
            engine.proc.send_signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            with pytest.raises(SpliceClientError) as err:
                for _ in stream:
                    pass
            waited = time.monotonic() - frozen_at
            assert err.value.code == grpc.StatusCode.UNAVAILABLE, err.value
            assert waited < 60, f"UNAVAILABLE only after {waited:.1f}s"  # keepalive (~15 s), not the 300 s deadline
            engine.proc.send_signal(signal.SIGCONT)
            resumed_at = time.monotonic()
            chunks = _retry_while(client, grpc.StatusCode.UNAVAILABLE, 90)
            print(f"frozen engine: UNAVAILABLE after {waited:.1f}s, served again {time.monotonic() - resumed_at:.1f}s "
                  "after SIGCONT")
            assert chunks[-1].finish_reason in ("stop", "length")
    finally:
        if engine.alive:
            engine.proc.send_signal(signal.SIGCONT)
        pre.stop()
        engine.stop()


def _retry_while(client: SpliceClient, code: grpc.StatusCode, seconds: float, content: str = "Hi") -> list:
    """A short greedy chat, retried while it fails with `code` (a service coming back), for `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return list(client.chat([{"role": "user", "content": content}], temperature=0.0, max_tokens=3))
        except SpliceClientError as exc:
            if exc.code != code or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_cancelled_stream_frees_the_engine_slot(tiny_dirs):
    # one running sequence and no queue: a second request is refused while the slot is taken
    engine, pre = start_stack(MODEL, engine_args=["--max-running-seqs", "1", "--max-queue", "0"])
    try:
        with SpliceClient(pre.address, timeout=120) as client:
            stream = client.chat([{"role": "user", "content": "Tell me a long story."}], **LONG)
            next(stream)
            with pytest.raises(SpliceClientError) as busy:
                list(client.chat([{"role": "user", "content": "Hi"}], max_tokens=2))
            assert busy.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, busy.value
            stream.close()  # cancels the call, which aborts the sequence in the engine

            chunks = _retry_while(client, grpc.StatusCode.RESOURCE_EXHAUSTED, 30)
            assert chunks[-1].finish_reason in ("stop", "length")
    finally:
        pre.stop()
        engine.stop()


def test_concurrent_clients_all_finish(stack):
    _, pre = stack
    results: dict[int, list] = {}

    def one(i: int) -> None:
        with SpliceClient(pre.address, timeout=120) as client:
            results[i] = list(client.chat([{"role": "user", "content": f"Count to {i}."}], temperature=0.0,
                                          max_tokens=4 + i, ignore_eos=True))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert sorted(results) == list(range(6))
    for i, chunks in results.items():
        assert chunks[-1].usage.completion_tokens == 4 + i
