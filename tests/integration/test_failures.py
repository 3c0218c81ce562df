"""Engine loss and cancellation, each on a stack of its own (they stop or saturate the engine)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import grpc
import pytest

from app.launch import start, start_stack, wait_healthy
from clients import SpliceClient, SpliceClientError
from tests.integration.conftest import MODEL

LONG = {"temperature": 0.0, "max_tokens": 1500, "ignore_eos": True}


@contextlib.contextmanager
def _long_stream(engine_args: tuple[str, ...] = ()):
    """A stack of this test's own and a client whose long greedy stream has begun: (engine, client, stream)."""
    engine, pre = start_stack(MODEL, engine_args=engine_args)
    box = {"engine": engine}  # the test may replace a killed engine by a restarted one
    try:
        with SpliceClient(pre.address, timeout=300) as client:
            stream = client.chat([{"role": "user", "content": "Tell me a long story."}], **LONG)
            next(stream)  # streaming has begun
            yield box, client, stream
    finally:
        if box["engine"].alive:
            box["engine"].proc.send_signal(signal.SIGCONT)  # a frozen engine must be able to stop
        pre.stop()
        box["engine"].stop()


def _ends_unavailable(stream, since: float) -> float:
    """Seconds until `stream` fails with UNAVAILABLE; promptly means well inside the 300 s call deadline,
    i.e. found by the connection, not by a timeout."""
    with pytest.raises(SpliceClientError) as err:
        for _ in stream:
            pass
    waited = time.monotonic() - since
    assert err.value.code == grpc.StatusCode.UNAVAILABLE, err.value
    assert waited < 60, f"UNAVAILABLE only after {waited:.1f}s"
    return waited


def _retry_while(client: SpliceClient, code: grpc.StatusCode, seconds: float) -> list:
    """A short greedy chat, retried while it fails with `code` (a service coming back), for `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return list(client.chat([{"role": "user", "content": "Hi"}], temperature=0.0, max_tokens=3))
        except SpliceClientError as exc:
            if exc.code != code or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_engine_killed_mid_stream_gives_unavailable_then_recovers(tiny_dirs):
    with _long_stream() as (box, client, stream):
        port = box["engine"].address.rsplit(":", 1)[1]
        box["engine"].kill()
        _ends_unavailable(stream, time.monotonic())
        box["engine"] = start("engine", ["--model", MODEL, "--host", "127.0.0.1", "--port", port])
        wait_healthy(box["engine"].address)
        assert _retry_while(client, grpc.StatusCode.UNAVAILABLE, 60)[-1].finish_reason in ("stop", "length")


def test_frozen_engine_gives_unavailable_without_waiting_for_the_deadline(tiny_dirs):
    # SIGSTOP: the engine's connection stays open but nothing answers, like a hung host or a partition
    with _long_stream() as (box, client, stream):
        box["engine"].proc.send_signal(signal.SIGSTOP)
        waited = _ends_unavailable(stream, time.monotonic())  # keepalive pings, about 5-15 s
        box["engine"].proc.send_signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        chunks = _retry_while(client, grpc.StatusCode.UNAVAILABLE, 90)
        print(f"frozen engine: UNAVAILABLE after {waited:.1f}s, served again {time.monotonic() - resumed_at:.1f}s "
              "after SIGCONT")
        assert chunks[-1].finish_reason in ("stop", "length")


def test_cancelled_stream_frees_the_engine_slot(tiny_dirs):
    # one running sequence and no queue: a second request is refused while the slot is taken
    with _long_stream(("--max-running-seqs", "1", "--max-queue", "0")) as (_, client, stream):
        with pytest.raises(SpliceClientError) as busy:
            list(client.chat([{"role": "user", "content": "Hi"}], max_tokens=2))
        assert busy.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, busy.value
        stream.close()  # cancels the call, which aborts the sequence in the engine
        assert _retry_while(client, grpc.StatusCode.RESOURCE_EXHAUSTED, 30)[-1].finish_reason in ("stop", "length")


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
