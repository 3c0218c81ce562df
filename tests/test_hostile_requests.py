"""What a caller sends cannot crash or stall a server: request messages that do not parse (malformed protobuf,
invalid UTF-8 in a string field) are INVALID_ARGUMENT with one log line, on both servers and every request shape
(unary, client stream); Generate and Upload streams hold the bytes they sent, not those they declared, and
streams that stall time out and release them (the engine's tensor budget; the preprocessor's admission, which
Upload shares with every other call)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import grpc
import pytest
import pytest_asyncio

from engine.config import EngineConfig
from engine.server import EngineServer
from preprocessor.admission import Admission
from preprocessor.core import PreprocessorCore
from preprocessor.limits import Limits
from preprocessor.server import PreprocessorServer
from splice.v1 import common_pb2, engine_pb2, engine_pb2_grpc, preprocessor_pb2
from tests.preprocessor.pp_factories import files_for, model_info_from_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

IDLE_TIMEOUT = 1.0
# While the checks that need stalled streams run, the idle timeout is this long, so that it cannot end them first
# however slow the machine; then it is lowered and each stream sends one more piece before it goes silent for good.
LONG_IDLE = 3600.0
TAIL = 4  # bytes of that last piece
GUARD = 120.0  # seconds a wait for a state may take before it fails the test (a hang, not a slow machine)
GARBAGE = b"\xff\xff\xff\xff\x0f"  # a field tag whose varint never ends


async def _until(done, what: str) -> None:
    """Waits until `done()` holds; fails the test if it still does not after GUARD seconds."""
    deadline = time.monotonic() + GUARD
    while not done():
        assert time.monotonic() < deadline, f"still not {what} after {GUARD:g} s"
        await asyncio.sleep(0.01)


async def _abandoned(call) -> None:
    """The server ends a silent stream with its idle-timeout refusal (waited for under GUARD)."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(_drain(call), GUARD)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
    assert "--upload-idle-timeout" in err.value.details()


async def _drain(call) -> None:
    async for _ in call:
        pass


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
async def engine_server(tiny_dirs):
    server = EngineServer(EngineConfig(model=str(tiny_dirs["tiny-text"]), model_name="tiny-text",
                                       upload_idle_timeout=IDLE_TIMEOUT))
    await server.start()
    yield server
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


async def test_engine_client_stream(engine_server, caplog):
    engine_address = engine_server.address
    header = engine_pb2.GenerateRequestPart(header=engine_pb2.GenerateHeader(request_id="abcd", token_ids=[1, 2]))
    for parts in ([GARBAGE], [header.SerializeToString(), GARBAGE], [_bad_utf8(header, "abcd")]):
        caplog.clear()
        async with grpc.aio.insecure_channel(engine_address) as channel:
            call = channel.stream_stream("/splice.v1.Engine/Generate")(iter(parts))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                _ = [c async for c in call]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
        _one_line(caplog)


async def test_stalled_uploads_time_out_and_release_the_tensor_budget(engine_server):
    info = engine_server.engine.info
    rows = 4
    nbytes = rows * info.hidden_size * 4
    header = engine_pb2.GenerateHeader(
        request_id="r", token_ids=[1] * (rows + 2),
        embed_spans=[common_pb2.EmbedSpan(offset=1, length=rows, tensor_index=0)],
        tensors=[engine_pb2.TensorMeta(name="prompt_embeds", dtype="float32", shape=[rows, info.hidden_size])],
        sampling=common_pb2.SamplingParams(max_tokens=1))
    servicer = engine_server.servicer
    budget = servicer.budget
    saved, budget.limit = budget.limit, nbytes + nbytes // 2  # not room for a whole one beside two halves
    servicer.upload_idle_timeout = LONG_IDLE
    resume, never = asyncio.Event(), asyncio.Event()

    async def stalls(sent: int):  # the header, one chunk of `sent` bytes (if any), then silence
        yield engine_pb2.GenerateRequestPart(header=header)
        if sent:
            yield engine_pb2.GenerateRequestPart(chunk=common_pb2.TensorChunk(tensor_index=0, data=bytes(sent)))
        await resume.wait()
        yield engine_pb2.GenerateRequestPart(chunk=common_pb2.TensorChunk(tensor_index=0, data=bytes(TAIL)))
        await never.wait()

    async def complete():
        yield engine_pb2.GenerateRequestPart(header=header)
        yield engine_pb2.GenerateRequestPart(chunk=common_pb2.TensorChunk(tensor_index=0, data=bytes(nbytes)))

    try:
        async with grpc.aio.insecure_channel(engine_server.address) as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            # Silent after the header: they hold nothing, however much they declared.
            idle = [stub.Generate(stalls(0)) for _ in range(4)] + [stub.Generate(stalls(nbytes // 2))
                                                                   for _ in range(2)]
            await _until(lambda: budget.used == nbytes, "holding the two halves sent")
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                _ = [r async for r in stub.Generate(complete())]
            assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert budget.used == nbytes  # (the refused one gave back what it took)
            servicer.upload_idle_timeout = IDLE_TIMEOUT
            resume.set()  # one more piece each, then silence: each is abandoned, and gives back what it held
            for call in idle:
                await _abandoned(call)
            assert budget.used == 0
            done = [r async for r in stub.Generate(complete())]
            assert done[-1].usage.completion_tokens == 1
    finally:
        resume.set()
        never.set()
        budget.limit = saved
        servicer.upload_idle_timeout = IDLE_TIMEOUT


async def test_uploads_hold_what_they_sent_and_silent_ones_time_out(tiny_dirs):
    """The public Upload stream shares the admission caps of every other call: it holds the bytes it has sent
    (a silent one holds next to nothing, so it cannot keep others out for free) and a place once complete; a
    silent one is abandoned after the idle timeout and gives back what it held; one declaring more than the
    byte cap is refused at its first message."""
    path = tiny_dirs["tiny-text"]
    info = model_info_from_config(path)
    rows = 64
    nbytes = rows * info.hidden_size * 4
    admission = Admission(max_concurrent=1, max_bytes=nbytes + nbytes // 2)
    core = PreprocessorCore(files_for(path), info, limits=Limits(upload_idle_timeout=LONG_IDLE))
    server = PreprocessorServer(core=core, admission=admission)
    port = await server.start()

    def declaring(n: int) -> preprocessor_pb2.UploadPart:
        return preprocessor_pb2.UploadPart(chat=preprocessor_pb2.ChatRequest(messages=[preprocessor_pb2.ChatMessage(
            role="user", content=[preprocessor_pb2.ContentPart(prompt_embeds=preprocessor_pb2.PromptEmbeds(
                tensor=common_pb2.Tensor(dtype="float32", shape=[n, info.hidden_size])))])]))

    resume, never = asyncio.Event(), asyncio.Event()

    async def sends(n: int, then_silent: bool = True):  # declares `rows`, sends `n` bytes of them
        yield declaring(rows)
        if n:
            yield preprocessor_pb2.UploadPart(chunk=common_pb2.TensorChunk(tensor_index=0, data=bytes(n)))
        if then_silent:
            await resume.wait()
            yield preprocessor_pb2.UploadPart(chunk=common_pb2.TensorChunk(tensor_index=0, data=bytes(TAIL)))
            await never.wait()

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            upload = channel.stream_stream("/splice.v1.Preprocessor/Upload",
                                           request_serializer=preprocessor_pb2.UploadPart.SerializeToString)
            silent = [upload(sends(0)) for _ in range(3)] + [upload(sends(nbytes // 2))]
            await _until(lambda: admission.held >= nbytes // 2, "holding the half sent")
            assert admission.running == 0 and nbytes // 2 <= admission.held < nbytes // 2 + 1024, admission.held
            # A unary call still finds its place: the silent streams hold none.
            tokenize = channel.unary_unary("/splice.v1.Preprocessor/Tokenize",
                                           request_serializer=preprocessor_pb2.TokenizeRequest.SerializeToString,
                                           response_deserializer=preprocessor_pb2.TokenizeResponse.FromString)
            assert (await tokenize(preprocessor_pb2.TokenizeRequest(text="hi"))).token_ids
            # Bytes that do not fit beside the half already held: refused as they arrive.
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                _ = [r async for r in upload(sends(nbytes, then_silent=False))]
            assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, busy.value
            assert "--max-inflight-request-bytes" in busy.value.details()
            # More than the cap declared: refused at once.
            too_big = preprocessor_pb2.UploadPart()
            too_big.CopyFrom(declaring(rows * 2))
            with pytest.raises(grpc.aio.AioRpcError) as never_fits:
                _ = [r async for r in upload(iter([too_big]))]
            assert never_fits.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than" in never_fits.value.details()
            core.limits = dataclasses.replace(core.limits, upload_idle_timeout=IDLE_TIMEOUT)
            resume.set()  # one more piece each, then silence: each is abandoned, and gives back what it held
            for call in silent:
                await _abandoned(call)
            assert admission.running == 0 and admission.held == 0
    finally:
        resume.set()
        never.set()
        await server.stop(0)
