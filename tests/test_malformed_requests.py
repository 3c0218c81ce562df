"""Request messages that do not parse (malformed protobuf, invalid UTF-8 in a string field) are
INVALID_ARGUMENT with one log line, on both servers and every request shape (unary, client stream)."""

from __future__ import annotations

import logging

import grpc
import pytest
import pytest_asyncio

from engine.config import EngineConfig
from engine.server import EngineServer
from preprocessor.core import PreprocessorCore
from preprocessor.server import PreprocessorServer
from splice.v1 import engine_pb2, preprocessor_pb2
from tests.preprocessor.pp_factories import files_for, model_info_from_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

GARBAGE = b"\xff\xff\xff\xff\x0f"  # a field tag whose varint never ends


def _bad_utf8(message, text: str) -> bytes:
    """`message` serialized with the bytes of `text` (a string field's value) replaced by invalid UTF-8."""
    raw = message.SerializeToString()
    assert raw.count(text.encode()) == 1
    return raw.replace(text.encode(), b"\xc3\x28" * (len(text) // 2))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pre_address(tiny_dirs):
    path = tiny_dirs["tiny-text"]
    server = PreprocessorServer(core=PreprocessorCore(files_for(path), model_info_from_config(path)))
    port = await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def engine_address(tiny_dirs):
    server = EngineServer(EngineConfig(model=str(tiny_dirs["tiny-text"]), model_name="tiny-text"))
    await server.start()
    yield server.address
    await server.stop(grace=0)


def _one_line(caplog) -> None:
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "malformed request message" in lines[0].getMessage(), lines
    assert lines[0].exc_info is None


async def _unary(address: str, method: str, payload: bytes) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/splice.v1.Preprocessor/{method}")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(payload)
        return err.value


@pytest.mark.parametrize("method, payload", [
    ("Detokenize", GARBAGE),
    ("Tokenize", _bad_utf8(preprocessor_pb2.TokenizeRequest(text="abcd"), "abcd")),
])
async def test_preprocessor_unary(pre_address, caplog, method, payload):
    err = await _unary(pre_address, method, payload)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not parse" in err.details(), err
    _one_line(caplog)


async def test_preprocessor_server_stream(pre_address, caplog):
    chat = preprocessor_pb2.ChatRequest(messages=[preprocessor_pb2.ChatMessage(role="user", text="hello")])
    async with grpc.aio.insecure_channel(pre_address) as channel:
        call = channel.unary_stream("/splice.v1.Preprocessor/Chat")(_bad_utf8(chat, "hello"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [c async for c in call]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not parse" in err.value.details()
    _one_line(caplog)
    # and it still serves
    ok = await channel_detokenize(pre_address)
    assert isinstance(ok, str)


async def channel_detokenize(address: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary("/splice.v1.Preprocessor/Detokenize",
                                   request_serializer=preprocessor_pb2.DetokenizeRequest.SerializeToString,
                                   response_deserializer=preprocessor_pb2.DetokenizeResponse.FromString)
        return (await call(preprocessor_pb2.DetokenizeRequest(token_ids=[1, 2]))).text


async def test_engine_client_stream(engine_address, caplog):
    header = engine_pb2.GenerateRequestPart(header=engine_pb2.GenerateHeader(request_id="abcd", token_ids=[1, 2]))
    for parts in ([GARBAGE], [header.SerializeToString(), GARBAGE], [_bad_utf8(header, "abcd")]):
        caplog.clear()
        async with grpc.aio.insecure_channel(engine_address) as channel:
            call = channel.stream_stream("/splice.v1.Engine/Generate")(iter(parts))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                _ = [c async for c in call]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
        _one_line(caplog)
