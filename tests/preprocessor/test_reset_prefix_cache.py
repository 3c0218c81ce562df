"""vLLM's POST /reset_prefix_cache on the HTTP face: one ResetPrefixCache per engine replica behind `--engine`, a 200
with no body only when every replica was reset, else 502/503 naming each that was not; its query parameters are
vLLM's, checked; the key covers it. Replicas here are stand-in engines (the real engines' side:
tests/integration/test_replicas.py)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2

from app.models import resolve_model
from preprocessor.engine_replicas import replicas
from preprocessor.http.options import HttpOptions
from preprocessor.server import PreprocessorServer
from splice.security import Security
from splice.v1 import engine_pb2
from tests.preprocessor.standin_engine import StandinEngine, start_standin
from tests.preprocessor.test_engine_link import wait_health

KEY = "k3y"


class ResettingEngine(StandinEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resets = 0

    async def ResetPrefixCache(self, request, context):
        self.resets += 1
        return engine_pb2.ResetPrefixCacheResponse()


def _dead_address() -> str:
    with socket.socket() as s:  # a port nobody listens on (bound, then given up)
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@contextlib.asynccontextmanager
async def _stack(tiny_dirs, tiny, kinds: str) -> AsyncIterator[tuple[httpx.AsyncClient, list, list[str]]]:
    """A preprocessor with the HTTP face (key KEY) on replicas of `kinds`: r = resets, p = a stand-in without the
    RPC (UNIMPLEMENTED), d = a dead address."""
    _, info = tiny["tiny-text"]
    engines, servers, addresses = [], [], []
    for kind in kinds:
        if kind == "d":
            engines.append(None)
            addresses.append(_dead_address())
            continue
        engine = (ResettingEngine if kind == "r" else StandinEngine)(info, [1])
        server, port = await start_standin(engine)
        engines.append(engine)
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    pre = PreprocessorServer(engine="ipv4:" + ",".join(addresses), model=str(tiny_dirs["tiny-text"]),
                             poll_interval=0.1, resolve=resolve_model, http=HttpOptions(port=0, api_key=KEY),
                             security=Security(api_key=KEY))
    port = await pre.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{pre.http_port}", timeout=60,
                               headers={"Authorization": f"Bearer {KEY}"})
    try:
        await wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
        yield client, engines, addresses
    finally:
        await client.aclose()
        await channel.close()
        await pre.stop(0)
        for server in servers:
            await server.stop(0)


async def test_every_replica_is_reset_behind_the_key(tiny_dirs, tiny):
    async with _stack(tiny_dirs, tiny, "rr") as (http, engines, _):
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=30) as anonymous:
            r = await anonymous.post("/reset_prefix_cache")
            assert r.status_code == 401 and [e.resets for e in engines] == [0, 0]
        r = await http.post("/reset_prefix_cache")
        assert r.status_code == 200 and r.content == b"", r.text  # vLLM's answer
        assert [e.resets for e in engines] == [1, 1]
        for query in ("reset_external=true", "reset_running_requests=false&reset_external=false"):
            assert (await http.post(f"/reset_prefix_cache?{query}")).status_code == 200
        assert [e.resets for e in engines] == [3, 3]


@pytest.mark.parametrize(("query", "named"), [
    ("reset_running_requests=true", "reset_running_requests=true is not supported"),
    ("reset_external=maybe", "reset_external"),
    ("reset_everything=true", "got reset_everything"),
])
async def test_a_query_it_cannot_honour_is_refused_by_name_and_resets_nothing(tiny_dirs, tiny, query, named):
    async with _stack(tiny_dirs, tiny, "r") as (http, engines, _):
        r = await http.post(f"/reset_prefix_cache?{query}")
        assert r.status_code == 400 and named in r.json()["error"]["message"], r.text
        assert engines[0].resets == 0


async def test_a_replica_not_reset_is_named_never_a_silent_200(tiny_dirs, tiny):
    async with _stack(tiny_dirs, tiny, "rpd") as (http, engines, addresses):
        r = await http.post("/reset_prefix_cache")
        message = r.json()["error"]["message"]
        assert r.status_code == 502 and "reset on 1 of 3 engine replicas" in message, r.text
        assert f"{addresses[1]} (UNIMPLEMENTED" in message and f"{addresses[2]} (UNAVAILABLE" in message
        assert addresses[0] not in message.partition("not on:")[2] and engines[0].resets == 1
    async with _stack(tiny_dirs, tiny, "rd") as (http, engines, addresses):
        r = await http.post("/reset_prefix_cache")
        assert r.status_code == 503 and f"not on: {addresses[1]} (UNAVAILABLE" in r.json()["error"]["message"]
        assert engines[0].resets == 1


async def test_the_target_forms_name_their_replicas():
    assert [(r.address, r.target) for r in await replicas("ipv4:10.0.0.1:5,10.0.0.2:6")] == \
        [("10.0.0.1:5", "ipv4:10.0.0.1:5"), ("10.0.0.2:6", "ipv4:10.0.0.2:6")]
    assert [r.target for r in await replicas("ipv6:[::1]:5,[::2]:6")] == ["ipv6:[::1]:5", "ipv6:[::2]:6"]
    assert [r.target for r in await replicas("engine:50061")] == ["engine:50061"]  # one engine: as it is
    assert [r.target for r in await replicas("unix:/run/engine.sock")] == ["unix:/run/engine.sock"]
    found = await replicas("dns:///localhost:50061")  # every address the name has now, each on its own
    assert "127.0.0.1:50061" in [r.address for r in found]
    assert {r.host for r in found} == {"localhost"} and all(r.target.startswith(("ipv4:", "ipv6:")) for r in found)
    assert [r.address for r in await replicas("dns://8.8.8.8/127.0.0.1:7")] == ["127.0.0.1:7"]
