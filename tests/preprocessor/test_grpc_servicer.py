"""The real servicer, interceptor, health and reflection over loopback gRPC, with ModelInfo supplied
directly (no engine): unary RPCs, and rejections that happen before the engine would be contacted."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from preprocessor.core import PreprocessorCore
from preprocessor.limits import Limits
from preprocessor.server import PreprocessorServer
from splice.tensors import tensor_to_pb
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc
from tests.preprocessor.pp_factories import png_bytes, rows

pb = preprocessor_pb2


@pytest.fixture
async def stub(tiny):
    files, info = tiny["tiny-llava"]
    server = PreprocessorServer(core=PreprocessorCore(files, info, limits=Limits(max_image_pixels=10_000)))
    port = await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield preprocessor_pb2_grpc.PreprocessorStub(channel), channel, files, info
    finally:
        await channel.close()
        await server.stop(0)


def _text(t):
    return pb.ContentPart(text=t)


def _embeds(x):
    return pb.ContentPart(prompt_embeds=pb.PromptEmbeds(tensor=tensor_to_pb(x)))


def _chat(*parts, **kw):
    return pb.ChatRequest(messages=[pb.ChatMessage(role="user", content=list(parts))], **kw)


async def _status(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        result = await call if not hasattr(call, "__aiter__") else [c async for c in call]
        del result
    return exc.value


async def test_health_reflection_and_model_info(stub):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    s, channel, _, info = stub
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "splice.v1.Preprocessor"):
        got = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert got.status == health_pb2.HealthCheckResponse.SERVING
    assert await s.GetModelInfo(common_pb2.GetModelInfoRequest()) == info.to_pb()
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    async for resp in reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
        names = {x.name for x in resp.list_services_response.service}
        assert {"splice.v1.Preprocessor", "grpc.health.v1.Health"} <= names


async def test_tokenize_chat_with_embeds_and_image(stub):
    s, _, _, info = stub
    x = rows(4, info.hidden_size)
    resp = await s.Tokenize(pb.TokenizeRequest(chat=_chat(pb.ContentPart(image=pb.ImageInput(data=png_bytes())),
                                                          _text("Look "), _embeds(x), _text(" now"))))
    assert all(t < info.vocab_rows for t in resp.token_ids)
    assert [(sp.length, sp.tensor_index) for sp in resp.embed_spans] == [(4, 0)]
    assert resp.prompt.count("<|splice_prompt_embeds_0|>") == 1 and "<image>" in resp.prompt
    assert list(resp.image_token_counts) == [list(resp.token_ids).count(info.image_token_id)]


async def test_tokenize_and_detokenize_text(stub):
    s, _, files, _ = stub
    resp = await s.Tokenize(pb.TokenizeRequest(text="Hello wörld"))
    assert list(resp.token_ids) == files.tokenizer("Hello wörld", add_special_tokens=False)["input_ids"]
    back = await s.Detokenize(pb.DetokenizeRequest(token_ids=resp.token_ids))
    assert back.text == "Hello wörld"


async def test_sentinel_text_rejected_over_grpc(stub):
    s, *_ = stub
    err = await _status(s.Chat(_chat(_text("x <|splice_prompt_embeds|>"))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[0].content[0]" in err.details() and "sentinel" in err.details()


async def test_image_placeholder_text_rejected_over_grpc(stub):
    s, *_ = stub
    err = await _status(s.Tokenize(pb.TokenizeRequest(chat=_chat(_text("<image>")))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "image placeholder" in err.details()


async def test_bad_embeds_rejected_over_grpc(stub):
    s, _, _, info = stub
    err = await _status(s.Chat(_chat(_text("a"), _embeds(rows(2, info.hidden_size + 3)))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages[0].content[1]" in err.details() and "hidden size" in err.details()
    x = rows(2, info.hidden_size)
    x[0, 0] = float("nan")
    err = await _status(s.Chat(_chat(_embeds(x))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "NaN" in err.details()


async def test_complete_out_of_range_id_over_grpc(stub):
    s, _, _, info = stub
    req = pb.CompleteRequest(prompt=[pb.PromptPart(token_ids=pb.TokenIds(ids=[1, info.vocab_rows + 7]))])
    err = await _status(s.Complete(req))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"token ID {info.vocab_rows + 7}" in err.details() and f"{info.vocab_rows} rows" in err.details()


async def test_image_failures_over_grpc(stub):
    s, *_ = stub
    err = await _status(s.Chat(_chat(pb.ContentPart(image=pb.ImageInput(path="/etc/hosts")))))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "--allowed-media-dir" in err.details()
    err = await _status(s.Chat(_chat(pb.ContentPart(image=pb.ImageInput(data=b"GIF89a broken")))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "cannot be decoded" in err.details()
    err = await _status(s.Chat(_chat(pb.ContentPart(image=pb.ImageInput(data=png_bytes(200, 100))))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 10000" in err.details()


async def test_malformed_requests_over_grpc(stub):
    s, *_ = stub
    both = pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="a", content=[_text("b")])])
    err = await _status(s.Chat(both))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "not both" in err.details()
    err = await _status(s.Chat(_chat(pb.ContentPart())))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "no kind" in err.details()
    err = await _status(s.Chat(_chat(_text("a"), sampling=common_pb2.SamplingParams(top_p=0.0))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in err.details()


async def test_no_engine_yet_is_unavailable(tiny):
    server = PreprocessorServer(engine="127.0.0.1:1", poll_interval=0.05)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            got = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert got.status == health_pb2.HealthCheckResponse.NOT_SERVING
            s = preprocessor_pb2_grpc.PreprocessorStub(channel)
            err = await _status(s.Tokenize(pb.TokenizeRequest(text="hi")))
            assert err.code() == grpc.StatusCode.UNAVAILABLE and "127.0.0.1:1" in err.details()
    finally:
        await server.stop(0)
