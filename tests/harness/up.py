"""`splice up` as a child process, the way its users run it: its output read as it comes, the addresses from its
ready line, its services' pids (to kill, freeze or measure them), Ctrl-C to stop it; and what /proc says of a
process (its RSS) and of a port (who listens on it, on which addresses). Used by faults.py, soak.py, bench/soak.py
and the integration tests of supervision and security."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

UP_LINE = re.compile(r"^splice up: preprocessor \(public API\) on (\S+:\d+)\S*.* engine on (\S+:\d+)")


def children(parent: int) -> dict[int, str]:
    """The running (not zombie) processes whose parent is `parent`: pid -> command line."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            out[int(stat.parent.name)] = cmdline
    return out


class Up:
    def __init__(self, *args: str, model: str = "tiny-idefics3", env: dict[str, str] | None = None) -> None:
        """Starts `splice up --model MODEL --quiet ARGS...` (env: added to this process's environment)."""
        self.proc = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--model", model, "--quiet", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.address = self.engine_address = ""
        self._ended = False  # its output ended: it exited
        threading.Thread(target=self._pump, name="splice-up-output", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def read_until(self, prefix: str, timeout: float = 240, start: int = 0) -> str:
        """The first line from index `start` on that begins with `prefix`, waiting up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((x for x in self.lines[start:] if x.startswith(prefix)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or self._ended:
                    raise AssertionError(f"no {prefix!r} line; output:\n{''.join(self.lines)}")
                self._changed.wait(left)

    def wait_ready(self, timeout: float = 240) -> str:
        """Waits for the ready line; sets `address` (public API) and `engine_address`."""
        line = self.read_until("splice up: preprocessor", timeout)
        match = UP_LINE.match(line)
        assert match, line
        self.address, self.engine_address = match.group(1), match.group(2)
        return line

    def child(self, service: str) -> tuple[int, str]:
        """(pid, command line) of the running `splice SERVICE` this `splice up` started."""
        for pid, cmdline in children(self.proc.pid).items():
            if f"app.cli {service}" in cmdline:
                return pid, cmdline
        raise AssertionError(f"no {service} child of {self.proc.pid}")

    def stop(self, timeout: float = 90) -> int:
        """Ctrl-C (both services drain and stop), then its exit code; killed if it outlives `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL `splice up` and its services (a failed test must not leave them serving)."""
        for service in ("engine", "preprocessor"):
            try:
                pid, _ = self.child(service)
            except AssertionError:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a frozen service dies too
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def rss_mib(pid: int) -> float:
    """Resident set size of `pid` in MiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _listening(port: int) -> list[tuple[str, str]]:
    """(local address as /proc/net/tcp* spells it, socket inode) of every socket listening on TCP `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            address, hex_port = cols[1].rsplit(":", 1)
            if int(hex_port, 16) == port and cols[3] == "0A":  # 0A: LISTEN
                found.append((address, cols[9]))
    return found


def listening_hosts(port: int) -> set[str]:
    """The addresses sockets listen on at TCP `port` ("127.0.0.1", "0.0.0.0", "::1", "::", ...)."""
    import ipaddress

    hosts = set()
    for address, _ in _listening(port):
        raw = bytes.fromhex(address)
        # the kernel prints each 32-bit word in host (little-endian) order
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
        ip = ipaddress.ip_address(raw)
        hosts.add(str(getattr(ip, "ipv4_mapped", None) or ip))  # gRPC binds 127.0.0.1 as ::ffff:127.0.0.1
    return hosts


def listening_pid(port: int) -> int | None:
    """The pid of this user's process listening on TCP `port` (IPv4 or IPv6), None if not found."""
    inodes = {f"socket:[{inode}]" for _, inode in _listening(port)}
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) in inodes:
                return int(fd.parent.parent.name)
        except OSError:
            continue
    return None
