"""docker-compose.yml cannot rot: each service's own command and environment, run as local processes,
serve and talk to each other (no Docker engine runs here)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from app.launch import start
from clients import SpliceClient

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expand(value: str) -> str:
    """Compose's ${VAR:-default} interpolation against this environment."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1), m.group(2)), value)


def _localize(argv: list[str], ports: dict[str, int], hosts: dict[str, str]) -> list[str]:
    """Container addresses -> loopback: 0.0.0.0 binds 127.0.0.1, container ports become free local ports,
    `service:port` becomes that service's local address."""
    out = []
    for arg in argv:
        arg = _expand(arg)
        if arg == "0.0.0.0":
            arg = "127.0.0.1"
        elif arg in ports:
            arg = str(ports[arg])
        elif match := re.fullmatch(r"([\w.-]+):(\d+)", arg):
            host, port = match.groups()
            arg = hosts[host] if host in hosts else f"{host}:{ports.get(port, port)}"
        out.append(arg)
    return out


def test_compose_services_serve_and_talk(tiny_dirs, tmp_path):
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"engine", "preprocessor"} <= set(services)
    assert services["preprocessor"]["depends_on"]["engine"]["condition"] == "service_healthy"
    assert services["engine-gpu"]["profiles"] == ["gpu"]

    env = {k: str(v) for k, v in services["engine"]["environment"].items()}
    env["SPLICE_CACHE"] = os.environ["SPLICE_CACHE"]  # the container's /cache volume, here the test cache
    # gRPC and Prometheus ports alike
    ports = {"50061": _free_port(), "50051": _free_port(), "9400": _free_port(), "9401": _free_port()}
    started = []
    try:
        hosts: dict[str, str] = {}
        for name in ("engine", "preprocessor"):
            argv = _localize(services[name]["command"], ports, hosts)
            assert argv[0] == "splice" and argv[1] == name
            service = start(name, argv[2:], env=env)
            started.append(service)
            hosts[name] = service.address
            assert any(line.startswith(f"{name} metrics on 127.0.0.1:") for line in service.output)
            # the container's own healthcheck command, pointed at the local port
            check = _localize(services[name]["healthcheck"]["test"][1:], ports, hosts)
            check = [sys.executable if c == "python" else c for c in check]
            for _ in range(120):
                if subprocess.run(check, capture_output=True, timeout=30).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                raise AssertionError(f"{name} healthcheck {check} never passed")
        with SpliceClient(hosts["preprocessor"], timeout=60) as client:
            chunks = list(client.chat([{"role": "user", "content": "Hello"}], temperature=0.0, max_tokens=3))
        assert chunks[-1].finish_reason in ("stop", "length")
    finally:
        for service in reversed(started):
            service.stop()
