"""How the HTTP face is configured: port, API key, remote media policy, connection guards."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HttpOptions:
    port: int = 8000  # 0 picks a free port; the host is the preprocessor's --host
    api_key: str | None = None  # when set, every route but /health needs "Bearer KEY" (auth.py)
    open_metrics: bool = False  # with a key: /metrics stays open (Prometheus scrapes without one)
    open_docs: bool = False  # with a key: /docs, /redoc, /openapi.json stay open (and gRPC reflection)
    allowed_media_domains: tuple[str, ...] = ()  # hosts http(s) image URLs may be fetched from; empty: none
    media_timeout: float = 10.0  # seconds for one remote image, connect to last byte
    drain_grace: float = 20.0  # seconds running requests get to finish on shutdown
    header_timeout: float = 10.0  # seconds a connection has to deliver a request's headers (connections.py)
    max_connections: int = 1024  # connections open at once; one more is answered 503 and closed

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"--http-port must be in [0, 65535], got {self.port}")
        if self.media_timeout <= 0:
            raise ValueError(f"--media-fetch-timeout must be > 0, got {self.media_timeout}")
        if self.header_timeout <= 0:
            raise ValueError(f"--http-header-timeout must be > 0, got {self.header_timeout}")
        if self.max_connections < 1:
            raise ValueError(f"--http-max-connections must be >= 1, got {self.max_connections}")
        object.__setattr__(self, "allowed_media_domains", tuple(d.lower() for d in self.allowed_media_domains))
