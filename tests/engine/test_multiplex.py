"""Engine/Multiplex over a loopback port, in-process: many GenerateWhole calls on one stream, through the raw stub and
through the preprocessor's EngineClient (which uses it for one engine): the same tokens and errors as one call per
request, a step's outputs in one message, cancel, half-close, a broken stream, per-call metrics, and drain."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
import torch

from engine.config import EngineConfig
from engine.multiplex import MAX_RESPONSE_BYTES, batches
from engine.server import EngineServer
from preprocessor.engine_client import EngineClient, EngineError
from splice.engine_output import FinishReason
from splice.engine_wire import encode_header, encode_whole
from splice.errors import Unavailable
from splice.metrics.rpc import RPCS
from splice.v1 import engine_pb2, engine_pb2_grpc
from tests.engine.engine_factories import image_inputs, random_ids, text_request, with_embed_span
from tests.engine.test_engine_grpc import bad_requests

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def until(condition, what: str) -> None:
    """Waits for a state the test can observe (bounded only so that a broken build fails instead of hanging)."""
    for _ in range(12000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


async def _serving(model: Path, name: str) -> EngineServer:
    srv = EngineServer(EngineConfig(model=str(model), model_name=name))
    await srv.listen()
    await srv.load()
    return srv


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tiny_dirs):
    srv = await _serving(tiny_dirs["tiny-idefics3"], "tiny-idefics3")
    yield srv
    await srv.stop(grace=1)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def clients(server):
    mux, per_call = EngineClient(server.address), EngineClient(server.address, multiplex=False)
    yield mux, per_call
    await mux.close()
    await per_call.close()


def _whole(req) -> engine_pb2.GenerateRequest:
    whole = encode_whole(req, encode_header(req))
    assert whole is not None
    return whole


def _idle(engine) -> bool:
    return engine.num_running == 0 and not engine.requests


async def _tokens(client: EngineClient, req) -> tuple[dict[int, list[int]], list]:
    """Each choice's tokens (choices interleave differently in a merged output), and the outputs."""
    outs = [o async for o in client.generate(req)]
    tokens: dict[int, list[int]] = {}
    for o in outs:
        tokens.setdefault(o.index, []).extend(o.token_ids)
    return tokens, outs


async def test_concurrent_calls_on_one_stream_give_their_per_call_tokens(server, clients, tiny_dirs):
    mux, per_call = clients
    ids, tensors = image_inputs(tiny_dirs["tiny-idefics3"])
    reqs = [text_request(random_ids(4 + i, seed=i), f"t{i}", max_tokens=12 + i, logprobs=True, top_logprobs=2)
            for i in range(6)]
    reqs.append(with_embed_span(ids, tensors, 3, torch.randn(2, 64, generator=torch.Generator().manual_seed(0)),
                                "picture", max_tokens=9, logprobs=True))
    reqs.append(text_request(random_ids(5, seed=9), "three", max_tokens=7, n=3, temperature=1.0, seed=4))
    solo = [await _tokens(per_call, r) for r in reqs]
    together = await asyncio.gather(*(_tokens(mux, r) for r in reqs))
    for (tokens, outs), (want, want_outs) in zip(together, solo, strict=True):
        assert tokens == want
        ends = {o.index: o for o in outs if o.finished}
        assert ends.keys() == {o.index for o in want_outs if o.finished}
        for o in want_outs:
            if o.finished:
                assert (ends[o.index].finish_reason, ends[o.index].usage) == (o.finish_reason, o.usage)
        for i in tokens:
            assert [lp for o in outs if o.index == i for lp in o.logprobs] == pytest.approx(
                [lp for o in want_outs if o.index == i for lp in o.logprobs])
            assert [t for o in outs if o.index == i for t in o.top_ids] == \
                [t for o in want_outs if o.index == i for t in o.top_ids]
    await until(lambda: _idle(server.engine), "every sequence released")


async def test_a_step_of_several_calls_is_one_message(server):
    async with grpc.aio.insecure_channel(server.address) as ch:
        outgoing: asyncio.Queue = asyncio.Queue()

        async def requests():
            while (r := await outgoing.get()) is not None:
                yield r

        call = engine_pb2_grpc.EngineStub(ch).Multiplex(requests())
        for i in range(8):
            req = text_request(random_ids(6, seed=20 + i), f"s{i}", max_tokens=30)
            outgoing.put_nowait(engine_pb2.MultiplexRequest(call_id=i + 1, start=_whole(req)))
        outgoing.put_nowait(None)  # half-close: the calls finish, then the stream ends
        responses = [r async for r in call]
    items = [item for r in responses for item in r.items]
    ends = [item for item in items if item.end]
    assert sorted(i.call_id for i in ends) == list(range(1, 9)) and {i.code for i in ends} == {"OK"}
    assert all(sum(len(i.output.token_ids) for i in items if i.call_id == k) == 30 for k in range(1, 9))
    # the steps where all 8 decode hand their outputs over at once: one message carries every call's token
    assert max(len({i.call_id for i in r.items}) for r in responses) == 8
    assert len(responses) < len(items) / 4
    assert (await call.code()) == grpc.StatusCode.OK


async def test_each_bad_request_ends_its_own_call_and_the_stream_keeps_serving(server, clients, tiny_dirs):
    mux, per_call = clients
    long = text_request(random_ids(5, seed=30), "long", max_tokens=40)
    running = asyncio.ensure_future(_tokens(mux, long))
    for what, (bad, message) in bad_requests(tiny_dirs, server.engine.info).items():
        if encode_whole(bad, encode_header(bad)) is None:
            continue
        with pytest.raises(EngineError) as err:
            await _tokens(mux, bad)
        assert err.value.code == "INVALID_ARGUMENT" and message in err.value.message, what
    other = text_request(random_ids(4, seed=31), "other-model", max_tokens=2)
    whole = _whole(other)
    whole.parts[0].header.model_fingerprint = "not-this-model"
    with pytest.raises(EngineError) as err:
        async for _ in mux._multiplexed.generate(whole):
            pass
    assert err.value.code == "FAILED_PRECONDITION" and "serves 'tiny-idefics3'" in err.value.message
    assert (await running)[0] == (await _tokens(per_call, long))[0]


async def test_closing_a_call_cancels_its_sequence_only(server, clients):
    mux, per_call = clients
    engine = server.engine
    keep = text_request(random_ids(5, seed=40), "keep", max_tokens=60)
    kept = asyncio.ensure_future(_tokens(mux, keep))
    cancelled = RPCS.labels("splice.v1.Engine", "Multiplex", "CANCELLED")
    before = cancelled._value.get()
    outputs = mux.generate(text_request(random_ids(5, seed=41), "cancel-me", max_tokens=5000))
    await anext(outputs)
    await outputs.aclose()  # the caller went away: a cancel goes out, the sequence aborts
    await until(lambda: not any(s.request_id == "cancel-me" for s in engine.requests.values()), "cancel-me aborted")
    await until(lambda: cancelled._value.get() == before + 1, "the cancelled call counted")
    assert (await kept)[0] == (await _tokens(per_call, keep))[0]
    assert (await _tokens(mux, keep))[0] == (await kept)[0]  # the same stream serves on
    await until(lambda: _idle(engine), "every sequence released")


async def test_calls_are_counted_one_by_one_under_multiplex(server, clients):
    ok = RPCS.labels("splice.v1.Engine", "Multiplex", "OK")
    before = ok._value.get()
    await asyncio.gather(*(_tokens(clients[0], text_request(random_ids(4, seed=50 + i), f"c{i}", max_tokens=3))
                           for i in range(3)))
    assert ok._value.get() == before + 3


async def test_bad_stream_messages_fail_the_stream(server):
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = engine_pb2_grpc.EngineStub(ch)
        req = _whole(text_request(random_ids(5, seed=60), "dup", max_tokens=2000))
        twice = [engine_pb2.MultiplexRequest(call_id=7, start=req)] * 2
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [r async for r in stub.Multiplex(iter(twice))]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "7 is already in flight" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [r async for r in stub.Multiplex(iter([engine_pb2.MultiplexRequest(call_id=3)]))]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "neither start nor cancel" in err.value.details()
    await until(lambda: _idle(server.engine), "the failed stream's calls aborted")


async def test_responses_are_cut_below_the_size_limit():
    big = engine_pb2.MultiplexItem(call_id=1)
    big.output.token_ids.extend(range(40_000))
    big.output.logprobs.extend([-1.5] * 40_000)
    items = [big] * 5 + [engine_pb2.MultiplexItem(call_id=2, end=True, code="OK")]
    cut = batches(items)
    assert [i for b in cut for i in b] == items and len(cut) > 1
    assert all(engine_pb2.MultiplexResponse(items=b).ByteSize() <= MAX_RESPONSE_BYTES for b in cut if len(b) > 1)


async def test_a_stream_that_breaks_fails_its_calls_unavailable_and_the_next_call_reopens(tiny_dirs):
    srv = await _serving(tiny_dirs["tiny-text"], "tiny-text")
    client = EngineClient(srv.address)
    try:
        outputs = client.generate(text_request(random_ids(5, seed=70), "cut", max_tokens=5000))
        await anext(outputs)
        first = client._multiplexed._stream
        await srv.stop(grace=0)  # the engine goes away mid-call
        with pytest.raises(Unavailable) as err:
            async for _ in outputs:
                pass
        assert srv.address in err.value.message
        with pytest.raises(Unavailable):  # a new stream, to an engine that is gone
            await _tokens(client, text_request(random_ids(5, seed=71), "after", max_tokens=2))
        assert client._multiplexed._stream is not first
    finally:
        await client.close()


async def test_draining_refuses_new_calls_and_ends_the_stream_after_its_calls(tiny_dirs):
    srv = await _serving(tiny_dirs["tiny-text"], "tiny-text")
    client = EngineClient(srv.address)
    try:
        outputs = client.generate(text_request(random_ids(5, seed=80), "running", max_tokens=300))
        first = await anext(outputs)
        stopping = asyncio.ensure_future(srv.stop(grace=600))
        await until(lambda: srv._drain.draining, "the drain started")
        with pytest.raises(Unavailable) as err:
            await _tokens(client, text_request(random_ids(5, seed=81), "late", max_tokens=2))
        assert "shutting down" in err.value.message
        rest = [o async for o in outputs]
        assert sum(len(o.token_ids) for o in [first, *rest]) == 300 and rest[-1].finish_reason is FinishReason.LENGTH
        await stopping  # the stream ended once its call was done: the drain did not wait out its grace
    finally:
        await client.close()
