"""Channel and server options shared by every Splice hop.

Keepalive pings let a caller notice a peer that hangs without closing its connection (a frozen process,
a partitioned host) in seconds, as UNAVAILABLE, instead of waiting for a deadline that may never come.
"""

from __future__ import annotations

import json

import grpc

from splice.errors import FailedPrecondition

KEEPALIVE_TIME_MS = 10_000  # ping an idle or busy connection this often
KEEPALIVE_TIMEOUT_MS = 5_000  # no ack within this: the connection is dead, its calls fail UNAVAILABLE

# A small receive window on the streams a client reads (token chunks): when the reader falls behind, the
# sender's write waits after a few messages instead of filling 64 KiB+ of buffers with single-token messages,
# so the pending tokens stay with the sender and go out merged into one message (engine/outbox.py). Sized in
# bytes of messages: a one-token message is ~10 bytes, so a handful of them are in flight. Only the receive
# side is affected: requests (tensor uploads) travel under the peer's window. Messages larger than the
# window still pass (gRPC grants what a pending read needs), and without BDP probing the window stays small.
READER_WINDOW_BYTES = 32
READER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.http2.lookahead_bytes", READER_WINDOW_BYTES),
    ("grpc.http2.bdp_probe", 0),
]

CLIENT_OPTIONS: list[tuple[str, int]] = [
    *READER_OPTIONS,
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),  # gRPC waits this long (default 60 s) for a ping ack
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # keep pinging during a long silent prefill
    # a restarted peer (or replica) is reconnected within ~0.3 s: gRPC's defaults take 2-5 s and the backoff
    # grows to two minutes
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]

# Servers must accept those pings, or they answer with GOAWAY (too_many_pings) and drop the connection.
# so_reuseport off: gRPC turns it on by default, so a second server on a busy port would start without
# error and share the port's connections with the first; binding must fail instead.
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
]


def bind(server: grpc.aio.Server, host: str, port: int, credentials: grpc.ServerCredentials | None = None) -> int:
    """Listens on host:port (0 = a free port), TLS with `credentials`, and returns the port; a busy port is an
    error, not shared."""
    try:
        if credentials is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise FailedPrecondition(f"cannot listen on {host}:{port}: the address is in use or not available")
    return bound


# --- replicas -------------------------------------------------------------------------------------------
# A target may name several replicas (`dns:///engine:50061`, `ipv4:10.0.0.1:50061,10.0.0.2:50061`); gRPC's own
# resolver, load balancer, health checking and retries spread and fail over the calls.

def service_config(service: str, weighted: bool, health_check: bool) -> str:
    """The channel's service config for calls to `service` on any number of replicas.

    - weighted round robin (`weighted`) follows the ORCA load each replica reports in its trailers
      (splice/load_report.py); plain round robin otherwise. A replica that reports nothing yet gets the
      mean weight, so both spread evenly until load differs.
    - health checking (`health_check`): a replica whose grpc.health.v1 status for `service` is not SERVING
      (loading, warming, draining) gets no calls. Without it such a replica answers UNAVAILABLE itself, with
      its own reason, and the call is retried on another one.
    - a call that fails UNAVAILABLE before the server answered anything (its first message) is retried on
      another replica; once a token streamed it is committed, and fails as it is.
    """
    policy = ({"weighted_round_robin": {"blackoutPeriod": "1s", "weightUpdatePeriod": "0.5s",
                                        "weightExpirationPeriod": "60s"}} if weighted else {"round_robin": {}})
    config: dict = {
        "loadBalancingConfig": [policy],
        "methodConfig": [{
            "name": [{"service": service}],
            "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
                            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
        }],
    }
    if health_check:
        config["healthCheckConfig"] = {"serviceName": service}
    return json.dumps(config)


def replica_options(service: str, weighted: bool = False, health_check: bool = False,
                    ) -> list[tuple[str, int | str]]:
    """CLIENT_OPTIONS for a channel whose target may resolve to several replicas of `service`."""
    return [*CLIENT_OPTIONS, ("grpc.service_config", service_config(service, weighted, health_check)),
            ("grpc.enable_retries", 1)]


def max_connection_age_options(seconds: float | None) -> list[tuple[str, int]]:
    """Server options that close each connection after `seconds` (streams in flight finish first): DNS is
    re-resolved only when a connection is lost, so this is how clients find replicas added since."""
    if not seconds:
        return []
    return [("grpc.max_connection_age_ms", int(seconds * 1000)),
            ("grpc.max_connection_age_grace_ms", 2**31 - 1)]  # never cut a running stream
