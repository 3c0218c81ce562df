"""Prometheus metrics shared by both services (RPC metrics) and the /metrics exporter.

Metrics live in the process-wide default registry and are defined once, at module level, so several
in-process servers (tests) share them instead of registering duplicates. Each service is its own
process, and each imports only its own module: the engine's /metrics shows splice_rpc_* and
splice_engine_*, the preprocessor's splice_rpc_* and splice_preprocessor_*.

    splice.metrics.rpc     RPCs by service/method/status code, latency (both services)
    engine/metrics.py      scheduler queue, tokens, finish reasons, step timing, TTFT
    preprocessor/metrics.py  normalization latency, prompt shape, TTFT and end-to-end latency
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server


@dataclass
class Exporter:
    host: str
    port: int  # the bound port (a free one when asked for 0)
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def start_exporter(host: str, port: int) -> Exporter:
    """Serves the default registry at http://HOST:PORT/metrics from a daemon thread (port 0: a free one)."""
    server, thread = start_http_server(port, addr=host)
    return Exporter(host, server.server_port, server, thread)
