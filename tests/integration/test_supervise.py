"""`splice up` supervises: flags pass through to the services, a killed engine is restarted (one line per
failure) while clients see UNAVAILABLE promptly and then succeed again; a busy port is one line, no traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from clients import SpliceClient, SpliceClientError
from tests.integration.conftest import MODEL
from tests.integration.test_cli import _free_port


def _up(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--model", MODEL, "--quiet", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy())


def _read_until(proc: subprocess.Popen, prefix: str, lines: list[str], timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return line
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError(f"no {prefix!r} line; output:\n{''.join(lines)}")


def _child(parent: int, service: str) -> tuple[int, str]:
    """(pid, command line) of `parent`'s child process running `splice SERVICE`."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == parent and f"app.cli {service}" in cmdline:
            return int(stat.parent.name), cmdline
    raise AssertionError(f"no {service} child of {parent}")


def test_busy_port_is_one_line(tiny_dirs):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        up = _up("--engine-port", str(port), "--port", str(_free_port()), "--http-port", "0")
        out, _ = up.communicate(timeout=240)
    assert up.returncode == 2, out
    assert "Traceback" not in out
    failures = [line for line in out.splitlines() if "did not start" in line]
    assert len(failures) == 1 and f"{port}" in failures[0], out


def test_killed_engine_is_restarted_with_its_flags(tiny_dirs):
    port, engine_port = _free_port(), _free_port()
    up = _up("--port", str(port), "--engine-port", str(engine_port), "--http-port", "0",
             "--engine-args", "--max-running-seqs 3", "--preprocessor-args", "--max-concurrent-requests 17")
    lines: list[str] = []
    try:
        _read_until(up, "splice up:", lines)
        engine_pid, engine_cmd = _child(up.pid, "engine")
        assert "--max-running-seqs 3" in engine_cmd
        assert "--max-concurrent-requests 17" in _child(up.pid, "preprocessor")[1]
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
            line = _read_until(up, "splice up: engine serving again", lines)
            back = time.monotonic() - killed
            assert f"127.0.0.1:{engine_port}" in line
            failures = [x for x in lines if "restarting in" in x]
            assert len(failures) == 1 and "signal 9" in failures[0], "".join(lines)
            assert "--max-running-seqs 3" in _child(up.pid, "engine")[1]
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
        up.send_signal(signal.SIGINT)
        assert up.wait(90) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
