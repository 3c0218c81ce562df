"""`splice up` supervises: flags pass through to the services, a killed engine is restarted (one line per
failure) while clients see UNAVAILABLE promptly and then succeed again; a busy port is one line, no traceback."""

from __future__ import annotations

import os
import signal
import socket
import time

import grpc
import pytest

from clients import SpliceClient, SpliceClientError
from tests.harness.up import Up
from tests.integration.test_cli import free_port


def test_busy_port_is_one_line(tiny_dirs):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = Up("--engine-port", str(port), "--port", str(free_port()), "--http-port", "0")
        assert up.proc.wait(240) == 2
    up.read_until("splice up: port")  # its output is read to the end
    out = "".join(up.lines)
    assert "Traceback" not in out
    # found before the engine started (no service output), naming the flag that moves it
    assert out.splitlines() == [f"splice up: port {port} on 127.0.0.1 is in use: pass --engine-port to choose "
                                f"another (0: a free one)"], out


def test_killed_engine_is_restarted_with_its_flags(tiny_dirs):
    port, engine_port = free_port(), free_port()
    up = Up("--port", str(port), "--engine-port", str(engine_port), "--http-port", "0",
            "--engine-args", "--max-running-seqs 3", "--preprocessor-args", "--max-concurrent-requests 17")
    try:
        up.wait_ready()
        engine_pid, engine_cmd = up.child("engine")
        assert "--max-running-seqs 3" in engine_cmd
        assert "--max-concurrent-requests 17" in up.child("preprocessor")[1]
        with SpliceClient(f"127.0.0.1:{port}", timeout=120) as client:
            stream = client.chat([{"role": "user", "content": "Go on."}], temperature=0.0, max_tokens=1500,
                                 ignore_eos=True)
            next(stream)
            os.kill(engine_pid, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(SpliceClientError) as err:
                list(stream)
            seen = time.monotonic() - killed
            assert err.value.code == grpc.StatusCode.UNAVAILABLE, err.value
            assert seen < 2.0, f"UNAVAILABLE after {seen:.2f}s"
            line = up.read_until("splice up: engine serving again")
            back = time.monotonic() - killed
            assert f"127.0.0.1:{engine_port}" in line
            failures = [x for x in up.lines if "restarting in" in x]
            assert len(failures) == 1 and "signal 9" in failures[0], "".join(up.lines)
            assert "--max-running-seqs 3" in up.child("engine")[1]
            deadline = time.monotonic() + 60
            while True:  # the preprocessor finds the engine again within its poll interval
                try:
                    chunks = list(client.chat([{"role": "user", "content": "Hi"}], max_tokens=2))
                    break
                except SpliceClientError as exc:
                    assert exc.code == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, exc
                    time.sleep(0.2)
            print(f"engine kill -9: UNAVAILABLE after {seen:.2f}s, restarted after {back:.1f}s, served again "
                  f"after {time.monotonic() - killed:.1f}s")
            assert chunks[-1].finish_reason in ("stop", "length")
        assert up.stop() == 0
    finally:
        up.kill()
