"""Preprocessor <-> engine over real gRPC, with a stand-in engine (standin_engine.py): the request the
engine reassembles, cancellation reaching the engine, engine errors passed on, engine restarts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.models import resolve_model
from preprocessor.core import PreprocessorCore
from preprocessor.server import PreprocessorServer
from splice.tensors import tensor_to_pb
from splice.v1 import common_pb2, engine_pb2_grpc, preprocessor_pb2, preprocessor_pb2_grpc
from tests.preprocessor.pp_factories import conversation, png_bytes, rows
from tests.preprocessor.standin_engine import StandinEngine, start_standin

pb = preprocessor_pb2
REPO = Path(__file__).resolve().parents[2]


async def wait_health(channel, want, timeout: float = 10.0) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = (await stub.Check(health_pb2.HealthCheckRequest())).status
        if got == want:
            return
        assert asyncio.get_running_loop().time() < deadline, f"health stayed {got}, wanted {want}"
        await asyncio.sleep(0.05)


class PerCallEngine(StandinEngine):
    """An engine from before Multiplex: the method is not implemented."""

    Multiplex = engine_pb2_grpc.EngineServicer.Multiplex


async def _link(tiny_dirs, tiny, name, model_flag=True, multiplex=True, kind=StandinEngine, **engine_kw):
    files, info = tiny[name]
    answer = files.tokenizer("All good here.", add_special_tokens=False)["input_ids"]
    engine = kind(info, answer, **engine_kw)
    engine_server, engine_port = await start_standin(engine)
    # Without a model flag the files come from the path the engine reports, as `splice preprocessor` does.
    pre = PreprocessorServer(engine=f"127.0.0.1:{engine_port}", model=str(tiny_dirs[name]) if model_flag else None,
                             poll_interval=0.1, resolve=resolve_model, engine_multiplex=multiplex)
    port = await pre.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
    return engine, engine_server, engine_port, pre, channel


async def _close(engine_server, pre, channel):
    await channel.close()
    await pre.stop(0)
    await engine_server.stop(0)


async def test_chat_through_the_engine_link(tiny_dirs, tiny):
    engine, es, _, pre, channel = await _link(tiny_dirs, tiny, "tiny-idefics3")
    files, info = tiny["tiny-idefics3"]
    try:
        x = rows(3, info.hidden_size)
        image = png_bytes(70, 45)
        req = pb.ChatRequest(messages=[pb.ChatMessage(role="user", content=[
            pb.ContentPart(image=pb.ImageInput(data=image)), pb.ContentPart(text="See "),
            pb.ContentPart(prompt_embeds=pb.PromptEmbeds(tensor=tensor_to_pb(x)))])],
            sampling=common_pb2.SamplingParams(temperature=0.0))
        chunks = [c async for c in preprocessor_pb2_grpc.PreprocessorStub(channel).Chat(req)]
        assert "".join(c.text for c in chunks) == "All good here."
        assert chunks[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
        # What crossed the wire is exactly what the core normalizes for the same conversation.
        got = engine.requests[0]
        want = PreprocessorCore(files, info).normalize_chat(
            conversation(("user", [image, "See ", x])), request_id=got.request_id).request
        assert got.token_ids == want.token_ids and got.embed_spans == want.embed_spans
        assert [t.name for t in got.tensors] == [t.name for t in want.tensors]
        assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(got.tensors, want.tensors, strict=True))
        assert got.sampling.greedy and got.request_id
        assert chunks[-1].usage.prompt_tokens == len(want.token_ids)
    finally:
        await _close(es, pre, channel)


HOPS = pytest.mark.parametrize("multiplex", [True, False], ids=["multiplex", "per-call"])


@HOPS
async def test_client_cancel_cancels_the_engine_call(tiny_dirs, tiny, multiplex):
    engine, es, _, pre, channel = await _link(tiny_dirs, tiny, "tiny-text", forever=True, delay=0.01,
                                              multiplex=multiplex)
    try:
        call = preprocessor_pb2_grpc.PreprocessorStub(channel).Chat(
            pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="hi")]))
        for _ in range(3):
            await call.read()
        call.cancel()
        await asyncio.wait_for(engine.cancelled.wait(), 10)
    finally:
        await _close(es, pre, channel)


@HOPS
async def test_stop_string_cancels_the_engine_call(tiny_dirs, tiny, multiplex):
    engine, es, _, pre, channel = await _link(tiny_dirs, tiny, "tiny-text", forever=True, delay=0.01,
                                              multiplex=multiplex)
    try:
        req = pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="hi")],
                             sampling=common_pb2.SamplingParams(stop=["here"]))
        chunks = [c async for c in preprocessor_pb2_grpc.PreprocessorStub(channel).Chat(req)]
        assert "".join(c.text for c in chunks) == "All good "
        assert chunks[-1].stop_reason == "here" and chunks[-1].finish_reason == common_pb2.FINISH_REASON_STOP
        await asyncio.wait_for(engine.cancelled.wait(), 10)
    finally:
        await _close(es, pre, channel)


@HOPS
async def test_engine_errors_keep_their_code(tiny_dirs, tiny, multiplex):
    _, es, _, pre, channel = await _link(tiny_dirs, tiny, "tiny-text", abort="span 0 out of range",
                                         multiplex=multiplex)
    try:
        call = preprocessor_pb2_grpc.PreprocessorStub(channel).Chat(
            pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="hi")]))
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            [c async for c in call]
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert exc.value.details() == "engine: span 0 out of range"
    finally:
        await _close(es, pre, channel)


async def test_an_engine_without_multiplex_gets_one_call_per_request(tiny_dirs, tiny, caplog):
    engine, es, _, pre, channel = await _link(tiny_dirs, tiny, "tiny-text", kind=PerCallEngine)
    try:
        for _ in range(2):
            chunks = [c async for c in preprocessor_pb2_grpc.PreprocessorStub(channel).Chat(
                pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="hi")]))]
            assert "".join(c.text for c in chunks) == "All good here."
        assert len(engine.requests) == 2
        assert sum("has no Multiplex method" in r.getMessage() for r in caplog.records) == 1
    finally:
        await _close(es, pre, channel)


async def test_serves_again_after_an_engine_restart(tiny_dirs, tiny):
    engine, es, engine_port, pre, channel = await _link(tiny_dirs, tiny, "tiny-text", model_flag=False)
    try:
        await es.stop(0)
        await wait_health(channel, health_pb2.HealthCheckResponse.NOT_SERVING)
        es, _ = await start_standin(StandinEngine(engine.info, engine.reply_ids), engine_port)
        await wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
        chunks = [c async for c in preprocessor_pb2_grpc.PreprocessorStub(channel).Chat(
            pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="hi")]))]
        assert "".join(c.text for c in chunks) == "All good here."
    finally:
        await _close(es, pre, channel)


async def test_cli_prints_the_real_port(tiny_dirs, tiny):
    info = tiny["tiny-text"][1]
    es, engine_port = await start_standin(StandinEngine(info, [5]))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "preprocessor", "--engine", f"127.0.0.1:{engine_port}", "--port", "0",
        "--model", str(tiny_dirs["tiny-text"]), "--poll-interval", "0.1",
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        assert line.startswith("preprocessor serving on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        assert port != 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            got = await preprocessor_pb2_grpc.PreprocessorStub(channel).GetModelInfo(common_pb2.GetModelInfoRequest())
            assert got == info.to_pb()
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        await es.stop(0)
