"""A preprocessor with its HTTP face in this process, on a stand-in engine (standin_engine.py), for the HTTP
face's own tests: real sockets and uvicorn, no engine process."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx
from grpc_health.v1 import health_pb2

from app.models import resolve_model
from preprocessor.admission import Admission
from preprocessor.http.options import HttpOptions
from preprocessor.limits import Limits
from preprocessor.server import PreprocessorServer
from splice.security import Security
from tests.preprocessor.standin_engine import StandinEngine, start_standin
from tests.preprocessor.test_engine_link import wait_health


@dataclass
class Face:
    pre: PreprocessorServer
    engine: StandinEngine
    http: httpx.AsyncClient  # on the HTTP face, with the key when one is set
    channel: grpc.aio.Channel  # on the gRPC face

    @property
    def http_address(self) -> tuple[str, int]:
        return "127.0.0.1", self.pre.http_port


@contextlib.asynccontextmanager
async def http_face(tiny_dirs, tiny, name: str = "tiny-text", http: HttpOptions | None = None,
                    admission: Admission | None = None, limits: Limits | None = None,
                    security: Security | None = None, answer: str = "All good.", **standin) -> AsyncIterator[Face]:
    """`answer`: the text the stand-in engine generates (its tokens, then a length finish); `standin`:
    StandinEngine's options (forever, delay, abort)."""
    files, info = tiny[name]
    engine = StandinEngine(info, files.tokenizer(answer, add_special_tokens=False)["input_ids"], **standin)
    engine_server, engine_port = await start_standin(engine)
    options = http or HttpOptions(port=0)
    pre = PreprocessorServer(engine=f"127.0.0.1:{engine_port}", model=str(tiny_dirs[name]), poll_interval=0.1,
                             resolve=resolve_model, http=options, admission=admission, limits=limits,
                             security=security or Security(api_key=options.api_key, open_docs=options.open_docs))
    port = await pre.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{pre.http_port}", headers=headers, timeout=60)
    try:
        await wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
        yield Face(pre, engine, client, channel)
    finally:
        await client.aclose()
        await channel.close()
        await pre.stop(0)
        await engine_server.stop(0)
