"""The ranks live and die together: a killed rank 0 leaves no worker blocked forever, and a dead worker ends the
engine (every forward needs every rank) so that its supervisor restarts the whole of it."""

from __future__ import annotations

import os
import signal
import time

import psutil

from app.launch import start, wait_healthy


def _workers(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if "engine.tp_worker" in " ".join(p.cmdline())]


def _gone(proc: psutil.Process, seconds: float) -> bool:
    try:
        proc.wait(seconds)
        return True
    except psutil.TimeoutExpired:
        return False


def test_killed_rank0_takes_its_worker_along(tiny_dirs):
    engine = start("engine", ["--model", "tiny-text", "--port", "0", "--tensor-parallel-size", "2"])
    wait_healthy(engine.address)
    (worker,) = _workers(engine.proc.pid)
    os.kill(engine.proc.pid, signal.SIGKILL)
    engine.proc.wait()
    assert _gone(worker, 10), "the worker rank outlived rank 0"


def test_a_dead_worker_ends_the_engine(tiny_dirs):
    engine = start("engine", ["--model", "tiny-text", "--port", "0", "--tensor-parallel-size", "2"])
    wait_healthy(engine.address)
    (worker,) = _workers(engine.proc.pid)
    worker.kill()
    since = time.monotonic()
    try:
        code = engine.proc.wait(30)
    finally:
        engine.kill()
    assert code != 0 and time.monotonic() - since < 30
    assert any("tensor-parallel rank" in line and "exited" in line for line in engine.output), engine.output[-5:]
