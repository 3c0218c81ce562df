"""Chat latency through the HTTP face (OpenAI's API) vs the gRPC face of one preprocessor, at concurrency 1 and 32.

    python -m bench.http_vs_grpc [--model tiny-idefics3] [--concurrency 1 32] [--repeats 5] [--per-worker 4]
                                 [--max-tokens 16] [--quick]

One stack (engine + preprocessor with --http-port) serves both faces. Each repeat runs the same greedy
chat request (ignore_eos, fixed length) as rounds of `concurrency` workers: gRPC Chat (streamed, every
chunk read), HTTP /v1/chat/completions not streamed, and streamed as SSE (every event read); the faces are
measured in turns. A round's latency is its median request; the table shows the median over repeats, and
HTTP / gRPC ratios (the budget: at most 1.3).
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx

from bench.common import bench_parser, in_turns_async
from bench.stacks import running_stack
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
    args = bench_parser(__doc__, quick={"concurrency": [1, 2], "repeats": 1, "per_worker": 1, "max_tokens": 4},
                        model="tiny-idefics3", repeats=5, concurrency=[1, 32], per_worker=4,
                        max_tokens=16).parse_args()
    sampling = {"temperature": 0.0, "max_tokens": args.max_tokens, "ignore_eos": True}
    body = {"model": args.model, "messages": MESSAGES, **sampling}
    limits = httpx.Limits(max_connections=max(args.concurrency) * 2, max_keepalive_connections=max(args.concurrency))
    with running_stack(args.model, http_port=0, engine_args=["--max-running-seqs", str(max(args.concurrency))]) as (
            _, pre):
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
                rounds = await in_turns_async({name: functools.partial(round_latency, request, conc, args.per_worker)
                                               for name, request in faces.items()}, args.repeats)
                g, h, s = (statistics.median(rounds[n]) * 1000 for n in ("grpc", "http", "http-sse"))
                print(f"{conc:>5} {g:>9.1f} {h:>9.1f} {s:>9.1f} {h / g:>10.2f} {s / g:>9.2f}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
