"""Ctrl-C in the terminal of `splice up` reaches its whole process group, services included: whenever it comes, the
stop is clean (no traceback, no teardown reports, no service left behind). A service stops without the
interpreter's teardown, where native modules torch imports (triton's, when installed) report every live object as
"leaked"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.up import children

UP = [sys.executable, "-m", "app.cli", "up", "--model", "tiny-text", "--port", "0", "--engine-port", "0",
      "--http-port", "0"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _up() -> subprocess.Popen:
    # its own session: the group Ctrl-C is sent to is its, not the tests'
    return subprocess.Popen(UP, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(up: subprocess.Popen) -> str:
    try:
        return up.communicate(timeout=120)[0]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)


def test_ctrl_c_while_a_service_starts_ends_it_with_its_launcher():
    up = _up()
    try:
        deadline = time.monotonic() + 120
        while not (engines := [p for p, cmd in children(up.pid).items() if "app.cli engine" in cmd]):
            assert up.poll() is None and time.monotonic() < deadline, "no engine started"
            time.sleep(0.05)
        os.killpg(up.pid, signal.SIGINT)  # the engine is importing or loading
    finally:
        out = _finish(up)
    assert up.returncode == 130 and "Traceback" not in out and "leaked" not in out, out
    assert not _alive(engines[0]), "the engine outlived splice up"


def test_ctrl_c_once_serving_is_a_clean_stop():
    up = _up()
    try:
        for line in up.stdout:
            if "Ctrl-C stops both" in line:
                break
        services = list(children(up.pid))
        os.killpg(up.pid, signal.SIGINT)
    finally:
        out = _finish(up)
    assert up.returncode == 0 and "Traceback" not in out and "leaked" not in out, out
    assert len(services) == 2 and not any(_alive(p) for p in services)


def test_a_service_exits_without_the_interpreters_teardown():
    code = ("import atexit, logging, sys; from splice.service_main import exit_service\n"
            "atexit.register(lambda: print('teardown ran'))\n"
            "logging.basicConfig(stream=sys.stderr); logging.getLogger('x').warning('logged')\n"
            "print('said', end=''); exit_service(3)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3 and out.stdout == "said" and "logged" in out.stderr  # flushed, then out
