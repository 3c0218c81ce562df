"""python -m app.healthcheck HOST:PORT — exit 0 when the server's grpc.health.v1 says SERVING.

The containers' healthcheck; needs no extra binary (grpc_health_probe) in the image.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def status(address: str, timeout: float = 3.0) -> str:
    """SERVING, NOT_SERVING (up, but loading or without its engine), or UNREACHABLE."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def check(address: str, timeout: float = 3.0) -> bool:
    return status(address, timeout) == "SERVING"


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if sys.argv[1:] in (["-h"], ["--help"]) else 2
    answer = status(sys.argv[1])
    print(answer)
    return 0 if answer == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
