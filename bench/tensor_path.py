"""The tensor path: prompt embeds of SIZE MiB through both hops (client -> preprocessor -> engine, real processes)
vs two plain loopback TCP copies of the same bytes, measured in turns.

    python -m bench.tensor_path [--mib 256] [--repeats 3] [--quick]

The stack serves tiny-text with its ModelInfo widened (max_model_len 2**21) so a prompt of SIZE MiB of rows
passes every check; the engine takes at most 8192 positions per forward, so after reassembly and full
validation (finite values included) the scheduler refuses it with INVALID_ARGUMENT. The clock stops on that
answer: the figure is the tensor path alone (client encode, both hops, decode and checks on each side), no
forward. The baseline sends the bytes over a loopback socket into a preallocated buffer, twice in a row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from bench.common import bench_parser, in_turns, report

WIDE_LEN = 1 << 21


def tcp_copy(data: memoryview) -> None:
    """One loopback TCP transfer of `data` into a buffer of its size."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    sink = bytearray(len(data))

    def receive() -> None:
        conn, _ = server.accept()
        view, got = memoryview(sink), 0
        while got < len(sink):
            got += conn.recv_into(view[got:got + (1 << 20)])
        conn.close()

    t = threading.Thread(target=receive)
    t.start()
    with socket.create_connection(("127.0.0.1", port)) as out:
        out.sendall(data)
    t.join()
    server.close()


def serve(kind: str, engine: str) -> None:
    from app.models import resolve_model
    from preprocessor.limits import Limits
    from preprocessor.server import PreprocessorServer

    async def run() -> None:
        if kind == "engine":
            from engine.config import EngineConfig
            from engine.llm_engine import LLMEngine
            from engine.loader import load
            from engine.server import EngineServer

            cfg = EngineConfig(model=str(resolve_model("tiny-text")), max_batch_tokens=8192,
                               max_inflight_tensor_bytes=8 << 30)
            loaded = load(cfg)
            loaded.info = dataclasses.replace(loaded.info, max_model_len=WIDE_LEN)
            server = EngineServer(cfg, engine=LLMEngine(cfg, loaded))
            await server.start()
        else:
            server = PreprocessorServer(engine=engine, limits=Limits(max_embeds_bytes=4 << 30))
            await server.start()
            await server.ready.wait()
            address = f"127.0.0.1:{server.port}"
        print(f"ready {server.address if kind == 'engine' else address}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


def spawn(kind: str, engine: str = "") -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "bench.tensor_path", "--serve", kind, "--engine", engine],
                            stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("ready "):
            return proc, line.split()[1]
    raise RuntimeError(f"{kind} did not start")


def main() -> None:
    parser = bench_parser(__doc__, quick={"mib": 8, "repeats": 1}, model=None, repeats=3, mib=256)
    parser.add_argument("--serve", choices=["engine", "preprocessor"], help="(internal) one service, in this process")
    parser.add_argument("--engine", default="", help="(internal) the engine a served preprocessor calls")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.engine)
        return
    import grpc

    from clients import SpliceClient, SpliceClientError

    engine, engine_addr = spawn("engine")
    pre, pre_addr = spawn("preprocessor", engine_addr)
    try:
        rows = (args.mib << 20) // (64 * 4)  # tiny-text: hidden 64, float32
        embeds = torch.randn(rows, 64)
        data = memoryview(embeds.numpy()).cast("B")
        with SpliceClient(pre_addr, timeout=600) as client:
            def hops() -> float:
                start = time.perf_counter()
                try:
                    list(client.complete([embeds], max_tokens=1))
                    raise RuntimeError("the widened prompt was not refused by the scheduler")
                except SpliceClientError as err:
                    if err.code != grpc.StatusCode.INVALID_ARGUMENT or "prefills at most" not in err.details:
                        raise
                return time.perf_counter() - start

            def tcp() -> float:
                start = time.perf_counter()
                tcp_copy(data)
                tcp_copy(data)
                return time.perf_counter() - start

            seconds = in_turns({"hops": hops, "tcp": tcp}, args.repeats)
        report(f"{args.mib} MiB prompt embeds, both hops vs two loopback TCP copies", seconds["hops"], seconds["tcp"],
               "s")
    finally:
        for p in (pre, engine):
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
