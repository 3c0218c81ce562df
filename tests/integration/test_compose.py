"""docker-compose.yml cannot rot: each service's own command and environment, run as local processes,
serve and talk to each other (no Docker engine runs here)."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml

from app.cli import build_parser
from app.launch import start
from app.scrape import metrics_address, scrape, total
from clients import SpliceClient
from splice.security import ENGINE_KEY_ENV
from splice.v1 import common_pb2, engine_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expand(value: str) -> str:
    """Compose's ${VAR:-default} and ${VAR:?error} interpolation against this environment, nested ones innermost
    first."""
    def one(match: re.Match) -> str:
        name, kind, text = match.groups()
        if os.environ.get(name):
            return os.environ[name]
        if kind == "?":  # compose refuses to start
            raise KeyError(f"{name}: {text}")
        return text

    while (expanded := re.sub(r"\$\{(\w+):([-?])([^}$]*)\}", one, value)) != value:
        value = expanded
    return value


def _localize(argv: list[str], ports: dict[str, int], hosts: dict[str, list[str]]) -> list[str]:
    """Container addresses -> loopback: 0.0.0.0 binds 127.0.0.1, container ports become free local ports,
    `service:port` becomes that service's local address, and `dns:///service:port` (every replica of it) a
    gRPC target listing each replica's local address."""
    out = []
    for arg in argv:
        arg = _expand(arg)
        if arg == "0.0.0.0":
            arg = "127.0.0.1"
        elif arg in ports:
            arg = str(ports[arg])
        elif match := re.fullmatch(r"dns:///([\w.-]+):(\d+)", arg):
            arg = "ipv4:" + ",".join(hosts[match.group(1)])
        elif match := re.fullmatch(r"([\w.-]+):(\d+)", arg):
            host, port = match.groups()
            arg = hosts[host][0] if host in hosts else f"{host}:{ports.get(port, port)}"
        out.append(arg)
    return out


def _healthy(service_def: dict, ports: dict[str, int], hosts: dict[str, list[str]]) -> None:
    """The container's own healthcheck command, pointed at the local port, passes."""
    check = _localize(service_def["healthcheck"]["test"][1:], ports, hosts)
    check = [sys.executable if c == "python" else c for c in check]
    for _ in range(120):
        if subprocess.run(check, capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"healthcheck {check} never passed")


def test_compose_needs_an_engine_key_and_gives_it_to_both_services(monkeypatch):
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    monkeypatch.delenv(ENGINE_KEY_ENV, raising=False)
    for name in ("engine", "preprocessor", "engine-gpu", "preprocessor-gpu"):
        with pytest.raises(KeyError, match=ENGINE_KEY_ENV):
            _expand(services[name]["environment"][ENGINE_KEY_ENV])
        assert not any("api-key" in arg for arg in services[name]["command"])  # not in argv: `ps` shows it


def test_compose_publishes_what_its_commands_serve():
    """Each preprocessor serves gRPC and the HTTP API on the ports `splice up` and deploy/kubernetes use, and
    publishes them; the image exposes them."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    exposed = {int(p) for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("EXPOSE")
               for p in line.split()[1:]}
    up = build_parser().parse_args(["up"])
    for name in ("preprocessor", "preprocessor-gpu"):
        args = build_parser().parse_args([_expand(a) for a in services[name]["command"][1:]])
        assert (args.port, args.http_port) == (up.port, up.http_port), name
        published = {tuple(int(p) for p in str(port).split("#")[0].strip().split(":")) for port in
                     services[name]["ports"]}
        assert {(args.port, args.port), (args.http_port, args.http_port)} <= published, name
        assert {args.port, args.http_port} <= exposed
    for name in ("engine", "engine-gpu"):
        assert build_parser().parse_args([_expand(a) for a in services[name]["command"][1:]]).port in exposed


def test_compose_services_serve_and_talk(tiny_dirs, tmp_path, monkeypatch):
    """Every engine replica and the preprocessor, as compose starts them; the preprocessor's calls reach both,
    and the engine refuses any other caller without the key."""
    monkeypatch.setenv(ENGINE_KEY_ENV, secrets.token_urlsafe(32))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"engine", "preprocessor"} <= set(services)
    assert services["preprocessor"]["depends_on"]["engine"]["condition"] == "service_healthy"
    assert services["engine-gpu"]["profiles"] == ["gpu"]
    replicas = int(_expand(str(services["engine"]["deploy"]["replicas"])))
    assert replicas >= 2

    started = []
    try:
        hosts: dict[str, list[str]] = {}
        metrics: dict[str, list[str]] = {}
        for name, count in (("engine", replicas), ("preprocessor", 1)):
            for _ in range(count):  # each replica is a container of its own: its own ports here
                ports = {"50061": _free_port(), "50051": _free_port(), "9400": _free_port(), "9401": _free_port(),
                         "8000": _free_port()}
                argv = _localize(services[name]["command"], ports, hosts)
                assert argv[0] == "splice" and argv[1] == name
                env = {k: _expand(str(v)) for k, v in services[name]["environment"].items()}
                env["SPLICE_CACHE"] = os.environ["SPLICE_CACHE"]  # the container's /cache volume, here the test's
                service = start(name, argv[2:], env=env)
                started.append(service)
                address = metrics_address(service)
                assert address.startswith("127.0.0.1:"), address
                metrics.setdefault(name, []).append(address)
                _healthy(services[name], ports, {**hosts, name: [service.address]})
                hosts.setdefault(name, []).append(service.address)
        with SpliceClient(hosts["preprocessor"][0], timeout=60) as client:
            for _ in range(2 * replicas):
                chunks = list(client.chat([{"role": "user", "content": "Hello"}], temperature=0.0, max_tokens=3))
                assert chunks[-1].finish_reason in ("stop", "length")
        http = started[-1].http_address  # the OpenAI-compatible API, as a user of `docker compose up` calls it
        assert http, "the compose preprocessor serves no HTTP API"
        body = json.dumps({"model": _expand("${SPLICE_MODEL:-tiny-idefics3-colors}"), "max_tokens": 3,
                           "messages": [{"role": "user", "content": "Hello"}]}).encode()
        request = urllib.request.Request(f"http://{http}/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert json.load(resp)["choices"][0]["finish_reason"] in ("stop", "length")
        for address in hosts["engine"]:  # another container on the network, without the key
            with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as err:
                engine_pb2_grpc.EngineStub(channel).GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        served = [total(scrape(address), "splice_engine_requests_finished_total") for address in metrics["engine"]]
        assert all(n > 0 for n in served), f"requests per engine replica: {served}"
    finally:
        for service in reversed(started):
            service.stop()
