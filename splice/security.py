"""Transport security and bearer tokens, the same way on both hops (client -> preprocessor -> engine).

TLS: a server with a certificate and key serves TLS; given a CA too, it requires client certificates signed by
it (mTLS). A client trusts the given CA (else the system roots) and may present its own certificate.
Tokens: a server with a key answers UNAUTHENTICATED to any splice.v1 call without `authorization: Bearer KEY`
metadata, before the request is parsed or admitted (splice/call_guard.py); health stays open (probes carry no key);
the preprocessor's reflection needs the key too unless `open_docs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

API_KEY_ENV = "SPLICE_API_KEY"  # the public API's key (gRPC and HTTP), when --api-key is not given
ENGINE_KEY_ENV = "SPLICE_ENGINE_API_KEY"  # the key the engine accepts from preprocessors


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class ServerTLS:
    cert: str | Path  # PEM certificate chain
    key: str | Path  # PEM private key
    ca: str | Path | None = None  # set: clients must present a certificate signed by this CA (mTLS)

    def credentials(self) -> grpc.ServerCredentials:
        pair = (_read(self.key, "--tls-key"), _read(self.cert, "--tls-cert"))
        ca = _read(self.ca, "--tls-ca")
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


@dataclass(frozen=True)
class ClientTLS:
    ca: str | Path | None = None  # CA that signed the server's certificate; None: the system's roots
    cert: str | Path | None = None  # client certificate, for servers that require one (mTLS)
    key: str | Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate needs both its certificate and its key")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=_read(self.ca, "CA"),
                                            private_key=_read(self.key, "client key"),
                                            certificate_chain=_read(self.cert, "client certificate"))


@dataclass(frozen=True)
class Security:
    """A server's settings: its own TLS and key and, for the preprocessor, how it reaches the engine."""

    tls: ServerTLS | None = None
    api_key: str | None = None  # callers must present it (the public API: gRPC and HTTP alike)
    open_docs: bool = False  # with api_key: the API's description (gRPC reflection, HTTP docs) stays open
    engine_tls: ClientTLS | None = None
    engine_api_key: str | None = None  # what the preprocessor presents to the engine


def server_tls(cert: str | None, key: str | None, ca: str | None) -> ServerTLS | None:
    """From the --tls-* flags: None when TLS is off; ValueError for an incomplete set."""
    if cert is None and key is None:
        if ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    tls = ServerTLS(cert, key, ca)
    tls.credentials()  # unreadable files are a start-up error, not a failure at the first connection
    return tls


def channel(target: str, tls: ClientTLS | None, options: list, aio: bool = False):
    """A (grpc.aio when `aio`) channel to `target`, TLS when `tls` is given."""
    module = grpc.aio if aio else grpc
    if tls is None:
        return module.insecure_channel(target, options=options)
    return module.secure_channel(target, tls.credentials(), options=options)


def bearer(api_key: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `api_key` (none without one)."""
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()
