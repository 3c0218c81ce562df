"""Chat latency through the HTTP face vs the gRPC face of one preprocessor, at concurrency 1 and 32.

    python -m bench.http_vs_grpc [--model tiny-idefics3] [--repeats 5] [--max-tokens 16]

One stack (engine + preprocessor with --http-port) serves both faces. Each repeat runs the same greedy
chat request (ignore_eos, fixed length) as rounds of `concurrency` workers: gRPC Chat (streamed, every
chunk read), HTTP /v1/chat/completions not streamed, and streamed as SSE (every event read); the face
order alternates between repeats. A round's latency is its median request; the table shows the median
over repeats, and HTTP / gRPC ratios (the issue's budget: at most 1.3).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx

from app.launch import start_stack
from clients import AsyncSpliceClient

MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]
Request = Callable[[], Awaitable[None]]


async def round_latency(request: Request, concurrency: int, per_worker: int) -> float:
    """Median seconds per request with `concurrency` workers, each sending `per_worker` requests in a row."""
    latencies: list[float] = []

    async def worker() -> None:
        for _ in range(per_worker):
            start = time.perf_counter()
            await request()
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statistics.median(latencies)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-idefics3")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-worker", type=int, default=4, help="requests each worker sends per round")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    engine, pre = start_stack(args.model, http_port=0, engine_args=["--max-running-seqs", str(max(args.concurrency))])
    sampling = {"temperature": 0.0, "max_tokens": args.max_tokens, "ignore_eos": True}
    body = {"model": args.model, "messages": MESSAGES, **sampling}
    limits = httpx.Limits(max_connections=max(args.concurrency) * 2, max_keepalive_connections=max(args.concurrency))
    try:
        async with AsyncSpliceClient(pre.address, timeout=120) as grpc_client, \
                httpx.AsyncClient(base_url=f"http://{pre.http_address}", timeout=120, limits=limits) as http:

            async def grpc_chat() -> None:
                async for _ in grpc_client.chat(MESSAGES, **sampling):
                    pass

            async def http_chat() -> None:
                resp = await http.post("/v1/chat/completions", json=body)
                resp.raise_for_status()
                resp.json()

            async def http_sse() -> None:
                async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
                    resp.raise_for_status()
                    async for _ in resp.aiter_lines():
                        pass

            faces = {"grpc": grpc_chat, "http": http_chat, "http-sse": http_sse}
            for request in faces.values():  # warm every path (template, JIT-ish caches, connections)
                await round_latency(request, 4, 2)
            print(f"model {args.model}, {args.max_tokens} tokens per answer, {args.repeats} repeats x "
                  f"{args.per_worker} requests per worker; median latency in ms")
            print(f"{'conc':>5} {'grpc':>9} {'http':>9} {'http-sse':>9} {'http/grpc':>10} {'sse/grpc':>9}")
            for conc in args.concurrency:
                rounds: dict[str, list[float]] = {name: [] for name in faces}
                for r in range(args.repeats):
                    order = list(faces) if r % 2 == 0 else list(reversed(faces))
                    for name in order:
                        rounds[name].append(await round_latency(faces[name], conc, args.per_worker))
                g, h, s = (statistics.median(rounds[n]) * 1000 for n in ("grpc", "http", "http-sse"))
                print(f"{conc:>5} {g:>9.1f} {h:>9.1f} {s:>9.1f} {h / g:>10.2f} {s / g:>9.2f}", flush=True)
    finally:
        pre.stop()
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
