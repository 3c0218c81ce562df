"""Channel and server options shared by every Splice hop.

Keepalive pings let a caller notice a peer that hangs without closing its connection (a frozen process,
a partitioned host) in seconds, as UNAVAILABLE, instead of waiting for a deadline that may never come.
"""

from __future__ import annotations

KEEPALIVE_TIME_MS = 10_000  # ping an idle or busy connection this often
KEEPALIVE_TIMEOUT_MS = 5_000  # no ack within this: the connection is dead, its calls fail UNAVAILABLE

CLIENT_KEEPALIVE: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # keep pinging during a long silent prefill
]

# Servers must accept those pings, or they answer with GOAWAY (too_many_pings) and drop the connection.
SERVER_KEEPALIVE: list[tuple[str, int]] = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
]
