"""Admission control over real gRPC and HTTP (stand-in engine): concurrent requests and in-flight request bytes
past their caps are RESOURCE_EXHAUSTED / 429 at once, both faces share the caps, and every place is given back."""

from __future__ import annotations

import asyncio

import grpc
import httpx
from grpc_health.v1 import health_pb2

from app.models import resolve_model
from preprocessor.admission import Admission
from preprocessor.http.options import HttpOptions
from preprocessor.server import PreprocessorServer
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc
from tests.preprocessor.standin_engine import StandinEngine, start_standin
from tests.preprocessor.test_engine_link import wait_health

pb = preprocessor_pb2
MAX_BYTES = 64 * 1024


async def test_caps_on_requests_and_bytes_across_both_faces(tiny_dirs, tiny):
    _, info = tiny["tiny-text"]
    engine = StandinEngine(info, [5, 6], forever=True, delay=0.02)
    engine_server, engine_port = await start_standin(engine)
    admission = Admission(max_concurrent=2, max_bytes=MAX_BYTES)
    pre = PreprocessorServer(engine=f"127.0.0.1:{engine_port}", model=str(tiny_dirs["tiny-text"]), poll_interval=0.1,
                             resolve=resolve_model, http=HttpOptions(port=0), admission=admission)
    port = await pre.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{pre.http_port}", timeout=30)
    try:
        await wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
        stub = preprocessor_pb2_grpc.PreprocessorStub(channel)

        # Bytes: one message larger than the cap is refused before it is parsed; a small one passes.
        big = pb.TokenizeRequest(text="x" * (MAX_BYTES + 1))
        try:
            await stub.Tokenize(big)
            raise AssertionError("admitted")
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-inflight-request-bytes" in err.details()
        refused = await http.post("/tokenize", json={"prompt": "x" * (MAX_BYTES + 1)})  # larger than the cap: 413
        assert refused.status_code == 413 and "--max-inflight-request-bytes" in refused.text
        assert (await stub.Tokenize(pb.TokenizeRequest(text="hello"))).token_ids

        # Requests: two endless streams (one per face) take both places; a third request on either face waits
        # for nothing and is refused; closing the streams gives the places back.
        chat = pb.ChatRequest(messages=[pb.ChatMessage(role="user", text="Hi")],
                              sampling=common_pb2.SamplingParams(max_tokens=2000))
        first = stub.Chat(chat)
        await first.read()
        second = http.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 2000})
        response = await second.__aenter__()
        assert response.status_code == 200
        lines = response.aiter_lines()  # kept: a dropped line iterator closes the response
        await anext(lines)
        assert admission.running == 2
        try:
            await stub.Detokenize(pb.DetokenizeRequest(token_ids=[1]))
            raise AssertionError("admitted")
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-concurrent-requests" in err.details()
        assert (await http.post("/detokenize", json={"tokens": [1]})).status_code == 429
        first.cancel()
        await second.__aexit__(None, None, None)
        for _ in range(200):
            if admission.running == 0:
                break
            await asyncio.sleep(0.02)
        assert admission.running == 0 and admission.held == 0
        assert isinstance((await stub.Detokenize(pb.DetokenizeRequest(token_ids=[1]))).text, str)
    finally:
        await http.aclose()
        await channel.close()
        await pre.stop(0)
        await engine_server.stop(0)
