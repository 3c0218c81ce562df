"""splice.v1.Engine over a loopback port, in-process, through the generated stubs: codes, health, cancel."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import pytest_asyncio
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from engine.config import EngineConfig
from engine.server import EngineServer
from preprocessor.engine_client import EngineClient
from splice.engine_output import FinishReason, Usage
from splice.engine_request import PROMPT_EMBEDS, EmbedSpan, EngineRequest, NamedTensor
from splice.engine_wire import encode_header, encode_request, encode_whole
from splice.model_info import ModelInfo
from splice.sampling import SamplingParams
from splice.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from tests.engine.engine_factories import GREEDY, image_inputs, random_ids, text_request, with_embed_span

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tiny_dirs):
    srv = EngineServer(EngineConfig(model=str(tiny_dirs["tiny-idefics3"]), model_name="tiny-idefics3"))
    await srv.listen()
    async with grpc.aio.insecure_channel(srv.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        before = await health.Check(health_pb2.HealthCheckRequest(service="splice.v1.Engine"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await engine_pb2_grpc.EngineStub(ch).GetModelInfo(common_pb2.GetModelInfoRequest())
        srv.loading_answers = (before.status, err.value.code())
    await srv.load()
    yield srv
    await srv.stop(grace=1)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stub(server):
    async with grpc.aio.insecure_channel(server.address) as ch:
        yield engine_pb2_grpc.EngineStub(ch), ch


async def _generate(stub, req: EngineRequest) -> list[engine_pb2.GenerateResponse]:
    return [r async for r in stub.Generate(encode_request(req, chunk_bytes=256))]


async def _generate_whole(stub, req: EngineRequest) -> list[engine_pb2.GenerateResponse]:
    whole = encode_whole(req, encode_header(req))
    assert whole is not None
    return [r async for r in stub.GenerateWhole(whole)]


async def test_health_is_not_serving_until_loaded_then_serving(server, stub):
    assert server.loading_answers == (health_pb2.HealthCheckResponse.NOT_SERVING, grpc.StatusCode.UNAVAILABLE)
    health = health_pb2_grpc.HealthStub(stub[1])
    for service in ("", "splice.v1.Engine"):
        resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_services(stub):
    refl = reflection_pb2_grpc.ServerReflectionStub(stub[1])
    responses = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name async for r in responses for s in r.list_services_response.service}
    assert {"splice.v1.Engine", "grpc.health.v1.Health"} <= names


async def test_model_info(server, stub):
    info = ModelInfo.from_pb(await stub[0].GetModelInfo(common_pb2.GetModelInfoRequest()))
    m = server.engine.m
    assert info.model == "tiny-idefics3" and info.architecture == "Idefics3ForConditionalGeneration"
    assert info.vocab_rows == m.embed.weight.shape[0] and info.hidden_size == m.model.config.text_config.hidden_size
    assert info.image_token_id == m.model.config.image_token_id and info.accepts_images
    assert info.max_model_len == m.model.config.text_config.max_position_embeddings and info.dtype == "float32"
    assert set(info.eos_token_ids) == set(m.model.generation_config.eos_token_id)


async def test_generate_streams_tokens_then_finish_and_usage_like_the_async_api(server, stub, tiny_dirs):
    ids, tensors = image_inputs(tiny_dirs["tiny-idefics3"])
    req = with_embed_span(ids, tensors, 3, torch.randn(2, 64), max_tokens=5, logprobs=True)
    resp = await _generate(stub[0], req)
    direct = [o async for o in server.engine.generate(req)]
    # one token per message, unless this reader fell behind and got steps merged (same tokens, in order)
    assert [t for r in resp for t in r.token_ids] == [t for o in direct for t in o.token_ids]
    assert all(len(r.logprobs) == len(r.token_ids) >= 1 for r in resp)
    assert [r.finish_reason for r in resp[:-1]] == [common_pb2.FINISH_REASON_UNSPECIFIED] * (len(resp) - 1)
    assert resp[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert (resp[-1].usage.prompt_tokens, resp[-1].usage.completion_tokens) == (len(req.token_ids), 5)


def _embeds_req(rows: torch.Tensor, ids=(1, 0, 0, 2), span=(1, 2, 0)) -> EngineRequest:
    return EngineRequest("bad", list(ids), [EmbedSpan(*span)], [NamedTensor(PROMPT_EMBEDS, rows)],
                         SamplingParams(**GREEDY, max_tokens=2))


def bad_requests(tiny_dirs, info: ModelInfo) -> dict[str, tuple[EngineRequest, str]]:
    ids, tensors = image_inputs(tiny_dirs["tiny-idefics3"])
    nan = torch.zeros(2, 64)
    nan[1, 3] = float("nan")
    return {
        "id out of range": (text_request([1, info.vocab_rows, 2]), f"token_ids: token ID {info.vocab_rows} (index 1)"),
        "span past the end": (_embeds_req(torch.zeros(3, 64), span=(2, 3, 0)), "past the prompt's 4 positions"),
        "overlapping spans": (EngineRequest("o", [0, 0, 0, 1], [EmbedSpan(0, 2, 0), EmbedSpan(1, 2, 1)],
                                            [NamedTensor(PROMPT_EMBEDS, torch.zeros(2, 64))] * 2), "overlap"),
        "span rows != tensor rows": (_embeds_req(torch.zeros(3, 64)), "has 3 rows, expected 2"),
        "hidden size": (_embeds_req(torch.zeros(2, 63)), "has 63 columns, expected hidden size 64"),
        "non-finite": (_embeds_req(nan), "non-finite"),
        "image tokens != feature rows": (EngineRequest("i", [*ids, info.image_token_id], tensors=[
            NamedTensor(k, v) for k, v in tensors.items()]), "image tokens"),
    }


async def test_each_invalid_input_is_invalid_argument_and_the_engine_keeps_serving(server, stub, tiny_dirs):
    ok = text_request(random_ids(6, seed=1), max_tokens=4)
    baseline = [t for r in await _generate(stub[0], ok) for t in r.token_ids]  # however the steps were merged
    for what, (req, message) in bad_requests(tiny_dirs, server.engine.info).items():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _generate(stub[0], req)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert message in err.value.details(), (what, err.value.details())
    assert [t for r in await _generate(stub[0], ok) for t in r.token_ids] == baseline


async def test_generate_whole_answers_and_refuses_as_the_stream_does(server, stub, tiny_dirs):
    ids, tensors = image_inputs(tiny_dirs["tiny-idefics3"])
    req = with_embed_span(ids, tensors, 3, torch.randn(2, 64), max_tokens=5, logprobs=True)
    streamed, whole = await _generate(stub[0], req), await _generate_whole(stub[0], req)
    assert [t for r in whole for t in r.token_ids] == [t for r in streamed for t in r.token_ids]
    assert whole[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH and whole[-1].usage == streamed[-1].usage
    for what, (bad, message) in bad_requests(tiny_dirs, server.engine.info).items():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _generate_whole(stub[0], bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert message in err.value.details(), (what, err.value.details())
    # parts missing: refused as a stream that ends short
    short = engine_pb2.GenerateRequest(parts=list(encode_whole(req, encode_header(req)).parts)[:-1])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stub[0].GenerateWhole(short)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "received 0 bytes" in err.value.details()
    # a part too many: refused as on the stream, before anything is generated; no budget stays held
    parts = list(encode_whole(req, encode_header(req)).parts)
    extra = engine_pb2.GenerateRequest(parts=[*parts, parts[-1]])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stub[0].GenerateWhole(extra)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"part {len(parts)} arrived after the request was complete" in err.value.details()
    assert server.servicer.budget.used == 0


async def test_a_part_after_the_request_is_complete_is_invalid_argument(server, stub):
    # The engine starts once the header and its declared bytes are in, without waiting for the half-close; a
    # part sent after that still fails the call, and the sequence is aborted.
    engine = server.engine
    req = text_request(random_ids(5, seed=4), "one-too-many", max_tokens=1500)
    extra = asyncio.Event()

    async def parts():
        for part in encode_request(req):
            yield part
        await extra.wait()
        yield engine_pb2.GenerateRequestPart(chunk=common_pb2.TensorChunk(tensor_index=0, data=b"x"))

    call = stub[0].Generate(parts())
    first = await call.read()  # generating before the stream ended
    assert len(first.token_ids) >= 1
    extra.set()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        while await call.read() is not grpc.aio.EOF:
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "after the request was complete" in err.value.details()
    for _ in range(500):
        if engine.num_running == 0 and not engine.requests:
            break
        await asyncio.sleep(0.01)
    assert engine.num_running == 0 and not engine.requests


async def test_a_broken_stream_is_invalid_argument(stub):
    chunk_first = [engine_pb2.GenerateRequestPart(chunk=common_pb2.TensorChunk(tensor_index=0, data=b"x"))]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stub[0].Generate(iter(chunk_first))]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "before the header" in err.value.details()


async def test_cancelling_the_call_aborts_the_sequence_and_frees_its_slot(server, stub):
    engine = server.engine
    call = stub[0].Generate(encode_request(text_request(random_ids(5, seed=2), "cancel-me", max_tokens=1500)))
    got = [await call.read() for _ in range(3)]
    assert all(len(r.token_ids) >= 1 for r in got)  # several when this reader fell behind
    assert engine.num_running == 1
    call.cancel()
    for _ in range(500):
        if engine.num_running == 0 and engine.runner.batch is None:
            break
        await asyncio.sleep(0.01)
    assert engine.num_running == 0 and engine.runner.batch is None and not engine.requests


async def test_tensor_bytes_over_the_inflight_budget_are_resource_exhausted(server, stub):
    hidden = server.engine.info.hidden_size
    held = with_embed_span(random_ids(4, seed=5), {}, 2, torch.zeros(8, hidden), "held", max_tokens=1500)
    other = with_embed_span(random_ids(4, seed=6), {}, 2, torch.zeros(8, hidden), "other", max_tokens=2)
    budget = server.servicer.budget
    saved, budget.limit = budget.limit, 8 * hidden * 4 * 3 // 2  # room for one such request, not two
    try:
        call = stub[0].Generate(encode_request(held))
        await call.read()  # "held" is running and holds its bytes
        assert budget.used == 8 * hidden * 4
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _generate(stub[0], other)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "do not fit" in err.value.details()
        call.cancel()
        for _ in range(500):
            if budget.used == 0:
                break
            await asyncio.sleep(0.01)
        assert budget.used == 0
        assert (await _generate(stub[0], other))[-1].usage.completion_tokens == 2
    finally:
        budget.limit = saved


async def test_an_empty_stream_is_invalid_argument(stub):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [r async for r in stub[0].Generate(iter([]))]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "empty" in err.value.details()


async def test_a_reader_that_falls_behind_gets_merged_messages_with_the_same_tokens(server):
    # The preprocessor's engine client: its small receive window makes the engine's writes wait for a slow
    # reader, so the pending steps stay in the engine and go out merged (splice/grpc_options.py READER_OPTIONS).
    client = EngineClient(server.address)
    try:
        req = text_request(random_ids(6, seed=3), "slow-reader", max_tokens=60)
        fast = [out async for out in client.generate(req)]
        outs = []
        async for out in client.generate(req):
            outs.append(out)
            if len(outs) == 1:  # stop reading (the loop stays free) until the engine has finished
                for _ in range(6000):
                    if server.engine.num_running == 0:
                        break
                    await asyncio.sleep(0.01)
    finally:
        await client.close()
    tokens = [t for o in fast for t in o.token_ids]
    assert len(tokens) == 60 and [t for o in outs for t in o.token_ids] == tokens
    assert len(outs) <= 12, [len(o.token_ids) for o in outs]  # a few in flight, then the rest as one message
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].usage == fast[-1].usage == Usage(6, 60)
