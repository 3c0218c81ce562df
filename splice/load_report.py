"""A server's load, as the ORCA report gRPC's weighted_round_robin policy reads from each call's trailers.

The report is xds.data.orca.v3.OrcaLoadReport in the `endpoint-load-metrics-bin` trailer. Splice sets two of its
fields, encoded here by hand (two doubles) rather than vendoring the xds protos:
application_utilization (field 9) and rps_fractional (field 6). The policy weighs a replica by
rps / utilization, so one twice as busy per request gets half the calls.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import deque

TRAILER = "endpoint-load-metrics-bin"
_RPS_FRACTIONAL = (6 << 3) | 1  # field 6, wire type 1 (64-bit)
_APPLICATION_UTILIZATION = (9 << 3) | 1
MIN_UTILIZATION = 0.01  # an idle replica still reports some: the policy ignores a utilization of 0


def encode_load_report(utilization: float, rps: float) -> bytes:
    """OrcaLoadReport{application_utilization, rps_fractional} in protobuf wire format."""
    return bytes([_RPS_FRACTIONAL]) + struct.pack("<d", rps) + \
        bytes([_APPLICATION_UTILIZATION]) + struct.pack("<d", utilization)


class CallRate:
    """Calls finished per second over the last `window` seconds (thread-safe). A short window: the balancer
    compares replicas' rps / utilization, which only means capacity when every rate covers the same recent past
    (a long window makes a freshly restarted replica look faster than one with an idle past)."""

    def __init__(self, window: float = 2.0) -> None:
        self.window = window
        self._times: deque[float] = deque()
        self._lock = threading.Lock()
        self._start = time.monotonic()

    def finished(self) -> None:
        with self._lock:
            self._times.append(time.monotonic())

    def per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._times and self._times[0] < now - self.window:
                self._times.popleft()
            count = len(self._times)
        return count / max(min(self.window, now - self._start), 1e-3)
