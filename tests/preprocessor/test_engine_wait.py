"""A preprocessor whose engine is not there yet, as a user watching its output meets it: its own ports at once,
"waiting for the engine" once and then every WAITING_EVERY seconds (not at every poll), and one line when it
drains and stops."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from preprocessor.engine_link import WAITING_EVERY, EngineLink


@pytest.fixture
def closed_port():
    """Bound, never listening: every connection to it is refused while the test holds it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


async def test_waiting_is_said_once_then_every_waiting_every_seconds(closed_port, caplog):
    now = [1000.0]
    link = EngineLink(target=f"127.0.0.1:{closed_port}", poll_interval=0.01, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="preprocessor.engine_link")

    def said(prefix: str) -> int:
        return sum(r.getMessage().startswith(prefix) for r in caplog.records)

    async def polls(n: int) -> None:  # every poll logs at DEBUG: the state waited on
        want = said("engine poll: ") + n
        while said("engine poll: ") < want:
            await asyncio.sleep(0.01)

    await link.start()
    try:
        await polls(5)
        assert said("waiting for the engine: ") == 1
        now[0] += WAITING_EVERY - 1
        await polls(3)
        assert said("waiting for the engine: ") == 1
        now[0] += 1
        await polls(3)
        assert said("waiting for the engine: ") == 2
    finally:
        await link.stop()


@pytest.mark.integration
def test_a_waiting_preprocessor_shows_its_ports_at_once_and_one_line_when_it_stops(closed_port):
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "preprocessor", "--engine", f"127.0.0.1:{closed_port}",
                             "--port", "0", "--http-port", "0", "--poll-interval", "0.05"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if " listening on " in line:
                break
        said = lines[-1].split(" listening on ", 1)[1]
        grpc_address = said.split(" (gRPC)")[0]
        http_address = said.split(", HTTP on ")[1].split(";")[0]
        assert f"NOT_SERVING until the engine at 127.0.0.1:{closed_port} answers" in said, said
        with grpc.insecure_channel(grpc_address) as channel:  # it listens, and says it is not ready
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        host, port = http_address.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=30).close()
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(60) == 0, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shown = "".join(lines) + rest
    assert shown.count("drained and stopped") == 1, shown
    assert "Traceback" not in shown, shown
