"""python -m splice.healthcheck HOST:PORT — exit 0 when the server's grpc.health.v1 says SERVING.

The containers' healthcheck; needs no extra binary (grpc_health_probe) in the image.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, timeout: float = 3.0) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    healthy = check(sys.argv[1])
    print("SERVING" if healthy else "NOT_SERVING")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
