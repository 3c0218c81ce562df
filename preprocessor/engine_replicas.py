"""Every engine replica behind the preprocessor's `--engine` target, each reached on its own: for what must happen on
all of them (a prefix cache reset, a LoRA adapter loaded or unloaded), where the link's balanced channel reaches only
one replica per call.

The target's forms (docs/operations.md): `HOST:PORT` is one engine (called through the target itself, so gRPC picks
whichever of the name's addresses answers); `ipv4:H1:P1,H2:P2` and `ipv6:[A1]:P1,...` list the replicas;
`dns:[//AUTHORITY/]NAME[:PORT]` is every address the name resolves to now, as gRPC's resolver would find them.
`unix:` targets and any other scheme are one engine.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

import grpc

from splice.grpc_options import CLIENT_OPTIONS
from splice.security import ClientTLS, bearer, channel
from splice.v1 import engine_pb2, engine_pb2_grpc

DEFAULT_PORT = "443"  # gRPC's, for a target that names none
RESET_TIMEOUT = 30.0  # seconds: a replica waits for its engine thread's next step, which one long prefill may hold


@dataclass(frozen=True)
class Replica:
    address: str  # how errors name it: HOST:PORT, [V6]:PORT
    target: str  # the gRPC target that reaches it alone
    host: str | None = None  # the DNS name it was resolved from: what its TLS certificate names


def _split_port(hostport: str) -> tuple[str, str]:
    if hostport.startswith("["):  # [v6]:port
        host, _, rest = hostport[1:].partition("]")
        return host, rest.removeprefix(":") or DEFAULT_PORT
    if hostport.count(":") == 1:
        host, port = hostport.split(":")
        return host, port or DEFAULT_PORT
    return hostport, DEFAULT_PORT  # no port, or a bare IPv6 address


def _address(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _resolve(name: str) -> list[Replica]:
    host, port = _split_port(name)
    try:
        ipaddress.ip_address(host)
        found = [host]
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        found = list(dict.fromkeys(info[4][0] for info in infos))  # in the resolver's order, each once
    return [Replica(_address(ip, port), ("ipv6:" if ":" in ip else "ipv4:") + _address(ip, port),
                    None if ip == host else host) for ip in found]


async def replicas(target: str) -> list[Replica]:
    """The replicas behind `target` now (a DNS name is resolved here; OSError when it cannot be)."""
    scheme, colon, rest = target.partition(":")
    if colon and scheme in ("ipv4", "ipv6"):
        return [Replica(a, f"{scheme}:{a}") for a in rest.removeprefix("//").split(",") if a]
    if colon and scheme == "dns":
        name = rest.removeprefix("//")
        if rest.startswith("//"):
            name = name.partition("/")[2]  # (after the authority: the DNS server, which the system's resolver is)
        return await _resolve(name)
    return [Replica(target, target)]


async def call_replica(replica: Replica, tls: ClientTLS | None, api_key: str | None, method: str, request) -> None:
    """One replica's unary `method` (an Engine RPC's name) on a channel of its own; grpc.aio.AioRpcError when it
    fails."""
    options = list(CLIENT_OPTIONS)
    if tls is not None and replica.host is not None:
        options.append(("grpc.ssl_target_name_override", replica.host))
    async with channel(replica.target, tls, options, aio=True) as ch:
        await getattr(engine_pb2_grpc.EngineStub(ch), method)(request, timeout=RESET_TIMEOUT, metadata=bearer(api_key))


@dataclass(frozen=True)
class ReplicaFailure:
    address: str
    code: str  # the gRPC status name
    message: str


async def call_every_replica(target: str, tls: ClientTLS | None, api_key: str | None, method: str, request,
                             ) -> tuple[list[str], list[ReplicaFailure]]:
    """`method` on every replica behind `target`, all at once: the addresses it succeeded on, and those that failed
    (a name that does not resolve is one failure, named by the target)."""
    try:
        found = await replicas(target)
    except OSError as exc:
        return [], [ReplicaFailure(target, "UNAVAILABLE", f"cannot resolve the engine target: {exc}")]
    results = await asyncio.gather(*(call_replica(r, tls, api_key, method, request) for r in found),
                                   return_exceptions=True)
    done, failed = [], []
    for replica, result in zip(found, results, strict=True):
        if isinstance(result, grpc.aio.AioRpcError):
            failed.append(ReplicaFailure(replica.address, result.code().name, result.details() or ""))
        elif isinstance(result, BaseException):
            raise result
        else:
            done.append(replica.address)
    return done, failed


async def reset_every_replica(target: str, tls: ClientTLS | None, api_key: str | None,
                              ) -> tuple[list[str], list[ReplicaFailure]]:
    """ResetPrefixCache on every replica behind `target`: the addresses reset, and those that failed."""
    return await call_every_replica(target, tls, api_key, "ResetPrefixCache", engine_pb2.ResetPrefixCacheRequest())
