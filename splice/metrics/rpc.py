"""RPC metrics, recorded by splice.call_guard.CallGuard in both services."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Streaming calls (Chat, Generate) last as long as the answer: the buckets reach minutes.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)

RPCS = Counter("splice_rpc_requests", "RPCs handled, by the status code the client received",
               ["service", "method", "code"])
RPC_SECONDS = Histogram("splice_rpc_duration_seconds", "RPC wall time, from the handler's start to its status",
                        ["service", "method"], buckets=LATENCY_BUCKETS)
RPCS_IN_FLIGHT = Gauge("splice_rpc_in_flight", "RPCs being handled now", ["service", "method"])
