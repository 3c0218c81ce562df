"""The wire's floor under bench.ttft_hops' figure: what two nested gRPC hops cost when the services do nothing else.

A relay process (in place of the preprocessor) answers each call by calling an echo process (in place of the
engine) and passing its first message back; both are grpc.aio servers on uvloop with Splice's own server and
channel options, unary-stream calls as Chat and GenerateWhole are, messages about as large as a first chunk.
`bench.ttft_hops` measures a call through them beside each request, so what our hops add can be read against
what the same two hops cost with no work in them.

    python -m bench.wire_floor [--repeats 500] [--quick]      # prints the floor alone
    python -m bench.wire_floor serve [--relay-to HOST:PORT]   # one of its processes (prints `port N`)
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import grpc

from bench.common import bench_parser, spread
from splice.grpc_options import CLIENT_OPTIONS, SERVER_OPTIONS
from splice.service_main import loop_factory

METHOD = "/splice.bench.Floor/Call"
REQUEST_BYTES = 120  # about a short chat request
RESPONSE_BYTES = 20  # about a first chunk (text, one token ID, finish, usage)


async def serve(relay_to: str | None) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    channel = grpc.aio.insecure_channel(relay_to, options=CLIENT_OPTIONS) if relay_to else None
    upstream = channel.unary_stream(METHOD) if channel else None

    async def call(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if upstream is None:
            yield b"x" * RESPONSE_BYTES
            return
        async for first in upstream(request):
            yield first
            return

    handler = grpc.unary_stream_rpc_method_handler(call)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("splice.bench.Floor", {"Call": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"port {port}", flush=True)
    await server.wait_for_termination()


class Floor:
    """The echo and relay processes; `await floor.call()` is one call through both, in seconds."""

    def __init__(self) -> None:
        """Inside a running event loop (its channel belongs to it)."""
        self._procs: list[subprocess.Popen] = []
        echo = self._start([])
        self.target = self._start(["--relay-to", echo])
        self._channel = grpc.aio.insecure_channel(self.target, options=CLIENT_OPTIONS)
        self._call = self._channel.unary_stream(METHOD)

    def _start(self, args: list[str]) -> str:
        proc = subprocess.Popen([sys.executable, "-m", "bench.wire_floor", "serve", *args], stdout=subprocess.PIPE,
                                text=True)
        self._procs.append(proc)
        line = proc.stdout.readline()
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"wire_floor server did not start: {line!r}")
        return f"127.0.0.1:{line.split()[1]}"

    async def call(self) -> float:
        start = time.perf_counter()
        async for _ in self._call(b"r" * REQUEST_BYTES):
            return time.perf_counter() - start
        raise RuntimeError("no message")

    async def close(self) -> None:
        await self._channel.close()
        self.stop()

    def stop(self) -> None:
        for proc in self._procs:
            proc.kill()
            proc.wait()


async def _alone(repeats: int) -> None:
    floor = Floor()
    try:
        for _ in range(20):
            await floor.call()
        times = [await floor.call() * 1e3 for _ in range(repeats)]
    finally:
        await floor.close()
    print(f"two nested gRPC hops, no work: {spread(times)} ms (n={repeats})")


def main() -> None:
    parser = bench_parser(__doc__, quick={"repeats": 20}, model=None, repeats=500)
    parser.add_argument("mode", nargs="?", choices=("measure", "serve"), default="measure")
    parser.add_argument("--relay-to", help="(serve) the echo process this relay calls")
    args = parser.parse_args()
    run = serve(args.relay_to) if args.mode == "serve" else _alone(args.repeats)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run)


if __name__ == "__main__":
    main()
