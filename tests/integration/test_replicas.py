"""Two engine replicas behind one preprocessor, through gRPC's own resolver, load balancing, health checking
and retries (`--engine ipv4:HOST:P1,HOST:P2`): both serve, a draining one gets nothing, a killed one leaves
every new request to the survivor, a restarted one gets traffic again, one serving another model refuses."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time

import grpc
import httpx
import pytest

from app.launch import Service, start, wait_healthy
from app.scrape import scrape, total, value
from clients import SpliceClient, SpliceClientError
from preprocessor.engine_client import EngineClient
from splice.engine_request import EngineRequest
from splice.sampling import SamplingParams

MODEL = "tiny-text"
OTHER_MODEL = "tiny-idefics3"  # another hidden size and vocabulary: another model fingerprint
HI = [{"role": "user", "content": "Hi"}]


def _engine(model: str = MODEL, port: int = 0) -> Service:
    engine = start("engine", ["--model", model, "--port", str(port), "--metrics-port", "0", "--drain-grace", "60",
                              "--max-running-seqs", "4"])
    wait_healthy(engine.address)
    return engine


def _finished(engine: Service) -> float:
    """Requests this replica finished, from its own Prometheus metrics."""
    return total(scrape(engine), "splice_engine_requests_finished_total")


def _generate_calls(engine: Service) -> float:
    """Generate and GenerateWhole calls this replica received, whatever it answered (refused ones included)."""
    samples = scrape(engine)
    return sum(total(samples, "splice_rpc_requests_total", method=m) + total(samples, "splice_rpc_in_flight", method=m)
               for m in ("Generate", "GenerateWhole"))


def _short(client: SpliceClient) -> str:
    return "".join(c.text for c in client.chat(HI, temperature=0.0, max_tokens=3))


@pytest.fixture(scope="module")
def fleet(tiny_dirs):
    engines = [_engine(), _engine()]
    target = "ipv4:" + ",".join(e.address for e in engines)
    pre = start("preprocessor", ["--engine", target, "--port", "0"])
    wait_healthy(pre.address)
    yield engines, pre
    pre.stop()
    for e in engines:
        e.stop(grace=5)


def test_both_replicas_serve(fleet):
    engines, pre = fleet
    before = [_finished(e) for e in engines]
    with SpliceClient(pre.address, timeout=60) as client:
        answers = {_short(client) for _ in range(16)}
    served = [_finished(e) - b for e, b in zip(engines, before, strict=True)]
    print(f"16 requests over two replicas: {served}")
    assert len(answers) == 1, "the same greedy answer from either replica"
    assert sum(served) == 16 and min(served) >= 4, served


def _resets(engine: Service) -> float:
    return total(scrape(engine), "splice_engine_prefix_cache_resets_total")


def test_reset_prefix_cache_reaches_every_replica_behind_the_key(fleet):
    """vLLM's POST /reset_prefix_cache on the HTTP face: one ResetPrefixCache per replica behind `--engine`, each
    counted by that replica; without the key nothing is reset."""
    import os
    from unittest import mock

    engines, _ = fleet
    target = "ipv4:" + ",".join(e.address for e in engines)
    with mock.patch.dict(os.environ, {"SPLICE_API_KEY": "reset-key"}):
        pre = start("preprocessor", ["--engine", target, "--port", "0", "--http-port", "0"])
    try:
        wait_healthy(pre.address)
        url = f"http://{pre.http_address}/reset_prefix_cache"
        before = [_resets(e) for e in engines]
        assert httpx.post(url, timeout=60).status_code == 401
        assert [_resets(e) for e in engines] == before
        r = httpx.post(url, headers={"Authorization": "Bearer reset-key"}, timeout=60)
        assert r.status_code == 200 and r.content == b"", r.text  # vLLM's answer: 200, no body
        assert [_resets(e) - b for e, b in zip(engines, before, strict=True)] == [1, 1]
    finally:
        pre.stop(grace=5)


def _hold_stream(engine: Service) -> None:
    """A long stream on `engine` directly (so that its drain lasts), running on a loop in a thread."""
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def run() -> None:
        client = EngineClient(engine.address)
        longest = (await client.get_model_info()).max_model_len - 3
        req = EngineRequest("hold", [1, 2, 3], sampling=SamplingParams(temperature=0.0, max_tokens=longest,
                                                                        ignore_eos=True))
        try:
            async for _ in client.generate(req):
                started.set()
        except Exception:
            pass
        finally:
            started.set()
            await client.close()

    threading.Thread(target=lambda: loop.run_until_complete(run()), daemon=True).start()
    assert started.wait(60)


def test_a_running_stream_fails_unavailable_when_its_replica_dies_and_the_next_request_succeeds(fleet):
    engines, pre = fleet
    with SpliceClient(pre.address, timeout=120) as client:
        stream = client.chat([{"role": "user", "content": "A long story."}], temperature=0.0, max_tokens=1500,
                             ignore_eos=True)
        first = next(stream)
        busy = [e for e in engines if _running(e) > 0]
        assert len(busy) == 1, [_running(e) for e in engines]
        victim = busy[0]
        victim.proc.send_signal(signal.SIGKILL)
        received = [first]
        with pytest.raises(SpliceClientError) as err:
            received.extend(stream)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE, err.value
        # every new request succeeds on the survivor, the first ones included (retried by gRPC if they hit the
        # dead replica before its connection was seen to close)
        survivor = next(e for e in engines if e is not victim)
        before = _finished(survivor)
        answers = [_short(client) for _ in range(8)]
        assert all(answers) and _finished(survivor) - before == 8

        # the replica restarted on its port gets calls again, without restarting anything else
        revived = _engine(port=int(victim.address.rsplit(":", 1)[1]))
        engines[engines.index(victim)] = revived
        since = time.monotonic()
        while _finished(revived) == 0:
            _short(client)
            assert time.monotonic() - since < 10, "the restarted replica got no call"
        print(f"restarted replica served again {time.monotonic() - since:.2f} s after it was SERVING")


def _running(engine: Service) -> float:
    return value(scrape(engine), "splice_engine_num_requests_running")


def test_a_draining_replica_gets_nothing(fleet):
    engines, pre = fleet
    draining, other = engines
    _hold_stream(draining)  # keeps the drain going
    draining.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the health watch sees NOT_SERVING
    try:
        before = [_generate_calls(e) for e in engines]
        with SpliceClient(pre.address, timeout=60) as client:
            for _ in range(8):
                assert _short(client)
        # not even a call it refused: health checking kept them all away
        assert _generate_calls(draining) == before[0], "a draining replica got a call"
        assert _generate_calls(other) - before[1] == 8
    finally:
        draining.kill()  # ends the held stream too
    engines[0] = _engine(port=int(draining.address.rsplit(":", 1)[1]))


@contextlib.contextmanager
def _idle_uploads(engine: Service, n: int, seconds: float):
    """`n` Generate calls to `engine` that send their header, declare a tensor and then nothing for `seconds`:
    in flight all along (load); cancelled on leaving."""
    from splice.v1 import engine_pb2, engine_pb2_grpc

    def parts():
        yield engine_pb2.GenerateRequestPart(header=engine_pb2.GenerateHeader(
            request_id="idle", token_ids=[1, 0, 0, 2], tensors=[engine_pb2.TensorMeta(
                name="prompt_embeds", dtype="float32", shape=[2, 64])]))
        time.sleep(seconds)

    with grpc.insecure_channel(engine.address) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        calls = [stub.Generate(parts()) for _ in range(n)]
        for call in calls:
            threading.Thread(target=_drain, args=(call,), daemon=True).start()
        try:
            yield
        finally:
            for call in calls:
                call.cancel()


def _drain(call) -> None:
    with contextlib.suppress(grpc.RpcError):
        for _ in call:
            pass


def test_a_busier_replica_gets_fewer_calls(fleet):
    """Weighted round robin on the load each replica reports in its trailers (ORCA): three calls in flight on one
    replica of four slots against none on the other."""
    engines, pre = fleet
    busy = engines[0]
    with _idle_uploads(busy, 3, 20.0):
        with SpliceClient(pre.address, timeout=60) as client:
            warm_until = time.monotonic() + 2.5  # both report their load; weights apply after a 1 s blackout
            while time.monotonic() < warm_until:
                _short(client)
            before = [_generate_calls(e) for e in engines]
            for _ in range(20):
                _short(client)
        got = [_generate_calls(e) - b for e, b in zip(engines, before, strict=True)]
    print(f"20 calls, busy replica vs idle one: {got}")
    assert got[0] + got[1] == 20 and got[1] >= 14, got


def test_clients_reach_several_preprocessors_through_one_target(fleet):
    engines, _ = fleet
    target = "ipv4:" + ",".join(e.address for e in engines)
    pres = [start("preprocessor", ["--engine", target, "--port", "0", "--metrics-port", "0"]) for _ in range(2)]
    try:
        for pre in pres:
            wait_healthy(pre.address)
        with SpliceClient("ipv4:" + ",".join(p.address for p in pres), timeout=60) as client:
            for _ in range(8):
                client.tokenize(text="Hi")
        calls = [total(scrape(pre), "splice_rpc_requests_total", method="Tokenize") for pre in pres]
        assert sum(calls) == 8 and min(calls) >= 2, calls  # round robin, from when both connections are up
    finally:
        for pre in pres:
            pre.stop(grace=5)


def test_a_replica_serving_another_model_refuses_and_is_named(fleet):
    engines, pre = fleet
    odd_port = int(engines[1].address.rsplit(":", 1)[1])
    engines[1].stop(grace=5)
    engines[1] = _engine(OTHER_MODEL, port=odd_port)
    refused, served = [], 0
    with SpliceClient(pre.address, timeout=60) as client:
        deadline = time.monotonic() + 20  # the channel reconnects to the restarted replica within a second
        while not (served and refused) and time.monotonic() < deadline:
            try:
                _short(client)
                served += 1
            except SpliceClientError as exc:
                refused.append(exc)
    print(f"served {served}, refused {len(refused)} in {time.monotonic() - deadline + 20:.2f} s")
    # Which replica disagrees depends on the model the preprocessor validated against (the first it saw); the
    # refusal names that one, never serves it wrong.
    assert served and refused, (served, refused)
    for exc in refused:
        assert exc.code == grpc.StatusCode.FAILED_PRECONDITION, exc
        assert "fingerprint" in exc.details and any(e.address in exc.details for e in engines), exc.details
