"""Starts the engine and the preprocessor as local processes and waits until they serve.

Used by `splice up`, `splice demo` and the integration tests, so the tests exercise the same start-up
path users do. Each service prints `<name> serving on HOST:PORT` once it is ready; a preprocessor with
an HTTP face prints `http serving on HOST:PORT` just before.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

READY = re.compile(r"^(engine|preprocessor) serving on (\S+:\d+)\s*$")
HTTP_READY = re.compile(r"^http serving on (\S+:\d+)\s*$")


class StartFailed(RuntimeError):
    """A service exited (or hung) before its ready line; `reason` is its last line, its own one-line error."""

    def __init__(self, name: str, code: int | None, output: list[str]) -> None:
        self.name, self.code = name, code
        self.reason = next((line for line in reversed(output) if line.strip()), "no output")
        tail = "\n".join(output[-30:])
        super().__init__(f"{name} did not become ready (exit code {code}); last output:\n{tail}")


@dataclass
class Service:
    name: str  # "engine" | "preprocessor"
    proc: subprocess.Popen
    address: str = ""  # HOST:PORT once ready
    http_address: str = ""  # HOST:PORT of the OpenAI-compatible HTTP face, if it serves one
    output: list[str] = field(default_factory=list)  # every line the process printed
    args: list[str] = field(default_factory=list)  # its command-line arguments (after the service name)
    ready: threading.Event = field(default_factory=threading.Event)  # its ready line came, or its output ended

    def restart_args(self) -> list[str]:
        """Its arguments with --port pinned to the port it got (a port-0 service restarts where it was)."""
        args = list(self.args)
        for flag, address in (("--port", self.address), ("--http-port", self.http_address)):
            if flag in args and address:
                args[args.index(flag) + 1] = address.rsplit(":", 1)[1]
        return args

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 30.0) -> int:
        """SIGTERM (graceful drain: the services' --drain-grace defaults to 20 s), then SIGKILL after `grace`
        seconds."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            self.proc.wait()


QUIET_LIBRARIES = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """A service started meanwhile never takes SIGINT (a blocked signal stays blocked across exec): a terminal's
    Ctrl-C reaches every process of its group, and one that came while a service imports or loads would leave a
    traceback there. Its launcher owns Ctrl-C and stops it (SIGTERM: a drain). A Ctrl-C that comes here meanwhile
    is delivered to the launcher once this ends, not lost."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def start(name: str, args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 300.0,
          echo: Callable[[str], None] | None = None) -> Service:
    """Runs `python -m app.cli NAME ARGS...` and returns once it printed its ready line."""
    cmd = [sys.executable, "-u", "-m", "app.cli", name, *args]
    proc: subprocess.Popen | None = None
    try:
        with _sigint_blocked():
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    env={**os.environ, **(env or {})})
        service = _watched(name, proc, args, echo)
        started = service.ready.wait(timeout)
    except BaseException:  # Ctrl-C while it starts: it ends with its launcher
        if proc is not None:
            Service(name, proc).stop()
        raise
    if not started or not service.address:
        service.kill()
        raise StartFailed(name, proc.poll(), service.output)
    return service


def _watched(name: str, proc: subprocess.Popen, args: Sequence[str], echo: Callable[[str], None] | None) -> Service:
    """The Service of `proc`, its output read in a thread: its addresses from its ready lines, the rest relayed to
    `echo`; `ready` set at its ready line, or when its output ends."""
    service = Service(name, proc, args=list(args))

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            service.output.append(line)
            match = READY.match(line)
            if http := HTTP_READY.match(line):
                service.http_address = http.group(1)
            elif match and match.group(1) == name and not service.ready.is_set():
                service.address = match.group(2)
                service.ready.set()
            elif echo:
                echo(f"[{name}] {line}")
        service.ready.set()  # the process ended; start() reports it

    threading.Thread(target=pump, name=f"{name}-output", daemon=True).start()
    return service


def wait_healthy(address: str, timeout: float = 120.0) -> None:
    """Polls grpc.health.v1 until the server reports SERVING."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} not SERVING after {timeout:.0f}s")
            time.sleep(0.2)


def start_stack(model: str, *, host: str = "127.0.0.1", engine_host: str = "127.0.0.1", engine_port: int = 0,
                preprocessor_port: int = 0,
                http_port: int | None = None, engine_args: Sequence[str] = (),
                preprocessor_args: Sequence[str] = (), echo: Callable[[str], None] | None = None,
                ) -> tuple[Service, Service]:
    """Engine first, then a preprocessor pointed at it. `http_port`: the preprocessor also serves the HTTP API
    there (0: a free port; its address is `pre.http_address`). `host` is the preprocessor's (public) listen
    address, `engine_host` the engine's: loopback unless asked, since only the preprocessor needs to reach it.

    Each ready line is printed once the service's health is SERVING (the engine loaded and warm, the
    preprocessor having reached the engine), so there is nothing left to poll, and nothing that would need
    the services' TLS credentials: `splice up` holds no client certificate for a public face under mTLS."""
    # The model is resolved (built, downloaded) before the stack starts: the services only load it, and the
    # libraries' bars and notices while they do ("Loading weights") would be noise among the relayed lines.
    quiet = {k: v for k, v in QUIET_LIBRARIES.items() if k not in os.environ}
    engine = start("engine", ["--model", model, "--host", engine_host, "--port", str(engine_port), *engine_args],
                   env=quiet, echo=echo)
    try:
        http = ["--http-port", str(http_port)] if http_port is not None else []
        pre = start("preprocessor", ["--engine", engine.address, "--host", host, "--port", str(preprocessor_port),
                                     *http, *preprocessor_args], env=quiet, echo=echo)
    except BaseException:
        engine.stop()
        raise
    return engine, pre
