"""With an API key, everything but health needs it: the API, /metrics, the docs (HTTP /docs, /redoc, /openapi.json
and gRPC reflection) and any path, unknown ones included; --open-metrics and --open-docs open those two."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from preprocessor.http.options import HttpOptions
from tests.preprocessor.http_face import http_face

KEY = "k3y"
DOCS = ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")


async def _reflected(channel: grpc.aio.Channel, key: str | None) -> list[str]:
    """The services reflection lists, asked with `key` (or without one)."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                     metadata=metadata)
    answers = [a async for a in call]
    return [s.name for s in answers[0].list_services_response.service]


async def test_with_a_key_only_health_is_open(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny, http=HttpOptions(port=0, api_key=KEY)) as face:
        async with httpx.AsyncClient(base_url=str(face.http.base_url), timeout=30) as anonymous:
            assert (await anonymous.get("/health")).status_code == 200
            for path in ("/metrics", *DOCS, "/v1/models", "/nowhere"):
                resp = await anonymous.get(path)
                assert resp.status_code == 401 and resp.json()["error"]["code"] == 401, (path, resp.text)
            wrong = await anonymous.get("/metrics", headers={"Authorization": "Bearer wrong"})
            assert wrong.status_code == 401
            posted = await anonymous.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert posted.status_code == 401 and posted.headers["connection"] == "close"  # its body is not drained
        for path in ("/metrics", *DOCS, "/v1/models"):
            assert (await face.http.get(path)).status_code == 200, path
        assert (await face.http.get("/nowhere")).status_code == 404
        assert "splice_preprocessor" in (await face.http.get("/metrics")).text

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _reflected(face.channel, None)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "splice.v1.Preprocessor" in await _reflected(face.channel, KEY)


async def test_open_metrics_and_open_docs(tiny_dirs, tiny):
    options = HttpOptions(port=0, api_key=KEY, open_metrics=True, open_docs=True)
    async with http_face(tiny_dirs, tiny, http=options) as face:
        async with httpx.AsyncClient(base_url=str(face.http.base_url), timeout=30) as anonymous:
            for path in ("/health", "/metrics", *DOCS):
                assert (await anonymous.get(path)).status_code == 200, path
            for path in ("/v1/models", "/nowhere"):
                assert (await anonymous.get(path)).status_code == 401, path
        assert "splice.v1.Preprocessor" in await _reflected(face.channel, None)


async def test_without_a_key_everything_is_open(tiny_dirs, tiny):
    async with http_face(tiny_dirs, tiny) as face:
        for path in ("/health", "/metrics", *DOCS, "/v1/models"):
            assert (await face.http.get(path)).status_code == 200, path
        assert "splice.v1.Preprocessor" in await asyncio.wait_for(_reflected(face.channel, None), 30)
