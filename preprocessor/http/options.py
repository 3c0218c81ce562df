"""How the HTTP face is configured: port, API key, remote media policy, connection guards."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

# The ports a bare host in --allowed-media-domains allows: http's and https's defaults, not every service it runs.
DEFAULT_PORTS = (80, 443)


def media_hosts(entries: tuple[str, ...]) -> frozenset[tuple[str, int]]:
    """--allowed-media-domains entries -> the (host, port) pairs they allow: HOST:PORT that port only, a bare HOST
    ports 80 and 443 only ([v6addr]:PORT for IPv6). ValueError for anything else."""
    out = set()
    for entry in entries:
        try:
            split = urlsplit("//" + entry.strip())
            host, port = split.hostname, split.port
        except ValueError:
            host = port = None
        if not host or split.path or split.query or split.fragment or split.username is not None:
            raise ValueError(f"--allowed-media-domains takes HOST or HOST:PORT entries, got {entry!r}")
        out.update((host.lower(), p) for p in ((port,) if port is not None else DEFAULT_PORTS))
    return frozenset(out)


@dataclass(frozen=True)
class HttpOptions:
    port: int = 8000  # 0 picks a free port; the host is the preprocessor's --host
    api_key: str | None = None  # when set, every route but /health needs "Bearer KEY" (auth.py)
    open_metrics: bool = False  # with a key: /metrics stays open (Prometheus scrapes without one)
    open_docs: bool = False  # with a key: /docs, /redoc, /openapi.json stay open (and gRPC reflection)
    allowed_media_domains: tuple[str, ...] = ()  # HOST:PORT (or HOST: 80/443) image URLs may name; empty: none
    media_timeout: float = 10.0  # seconds for one remote image, connect to last byte
    drain_grace: float = 20.0  # seconds running requests get to finish on shutdown
    header_timeout: float = 10.0  # seconds a connection has to deliver a request's headers (connections.py)
    max_connections: int = 1024  # connections open at once; one more is answered 503 and closed
    send_buffer_kb: int = 256  # each connection's kernel send buffer (SO_SNDBUF, connections.py); 0: the kernel's own
    body_idle_timeout: float = 30.0  # seconds a request body may stay silent while it is read (--upload-idle-timeout)
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter exist (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)
    allow_runtime_lora_updating: bool = False
    # vLLM's --served-model-name: the names /v1/models lists and a request's `model` may be (the first in answers);
    # empty: the model's own name
    served_model_names: tuple[str, ...] = ()
    return_tokens_as_token_ids: bool = False  # vLLM's flag: logprobs name tokens "token_id:N" unless a request says
    prompt_tokens_details: bool = False  # vLLM's --enable-prompt-tokens-details: usage's cached_tokens
    media_hosts: frozenset[tuple[str, int]] = field(init=False, default=frozenset())  # allowed_media_domains, parsed

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"--http-port must be in [0, 65535], got {self.port}")
        if self.media_timeout <= 0:
            raise ValueError(f"--media-fetch-timeout must be > 0, got {self.media_timeout}")
        if self.header_timeout <= 0:
            raise ValueError(f"--http-header-timeout must be > 0, got {self.header_timeout}")
        if self.body_idle_timeout <= 0:
            raise ValueError(f"--upload-idle-timeout must be > 0, got {self.body_idle_timeout}")
        if self.send_buffer_kb < 0:
            raise ValueError(f"--http-send-buffer-kb must be >= 0, got {self.send_buffer_kb}")
        if self.max_connections < 1:
            raise ValueError(f"--http-max-connections must be >= 1, got {self.max_connections}")
        if any(not name for name in self.served_model_names):
            raise ValueError("--served-model-name takes nonempty names")
        object.__setattr__(self, "allowed_media_domains", tuple(d.lower() for d in self.allowed_media_domains))
        object.__setattr__(self, "media_hosts", media_hosts(self.allowed_media_domains))
