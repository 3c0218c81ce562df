"""The engine's default torch threads (`--torch-threads` unset: this host's CPUs less one) vs torch's own default
(every core), each engine beside its preprocessor on this host as `splice up` runs them: two stacks up at once,
runs alternating, ratio per repeat.

    python -m bench.torch_threads [--model tiny-text] [--streams 64] [--new-tokens 64] [--repeats 3]
                                  [--stream-interval 1] [--engine-args '...']

Per repeat: whole-stack tok/s at STREAMS concurrent streams (bench.stack_throughput's requests), then TTFT at
concurrency 1 (median of 20 one-token chats, one image for a vision model) and one stream's tok/s (median of 3).
Neither stack gets $OMP_NUM_THREADS, so the engines choose as a user's would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import statistics
import time

from app.launch import Service, start
from bench.measure import report_paired
from bench.stack_throughput import prompts, stack_parser, stack_run
from bench.ttft_hops import png
from clients import AsyncSpliceClient, image_part, text_part
from engine.config import usable_cpus
from splice.model_info import IMAGE

TTFT_CALLS = 20
SOLO_CALLS = 3


def start_pair(model: str, streams: int, engine_args: list[str]) -> tuple[Service, Service]:
    engine = start("engine", ["--model", model, "--port", "0", "--max-running-seqs", str(streams), *engine_args])
    try:
        return engine, start("preprocessor", ["--engine", engine.address, "--port", "0"])
    except BaseException:
        engine.stop()
        raise


async def first_token_ms(client: AsyncSpliceClient, image: bytes | None) -> float:
    content = [text_part("Describe this, please."), *([image_part(image)] if image else [])]
    start_at = time.perf_counter()
    async for _ in client.chat([{"role": "user", "content": content}], temperature=0.0, max_tokens=1):
        break
    return (time.perf_counter() - start_at) * 1e3


async def main() -> None:
    args = stack_parser(__doc__).parse_args()
    os.environ.pop("OMP_NUM_THREADS", None)  # each engine picks its own threads, as under `splice up`
    cores = usable_cpus()  # torch's own default: every core
    flags = ["--stream-interval", str(args.stream_interval), *shlex.split(args.engine_args)]
    stacks = {"ours": start_pair(args.model, args.streams, flags),
              "torch": start_pair(args.model, args.streams, [*flags, "--torch-threads", str(cores)])}
    try:
        async with contextlib.AsyncExitStack() as opened:
            clients = {name: await opened.enter_async_context(AsyncSpliceClient(pre.address, timeout=600))
                       for name, (_, pre) in stacks.items()}
            figures = await measure(args, clients)
        ours, base = figures["ours"], figures["torch"]
        what = f"{args.model}: engine at its default torch threads vs --torch-threads {cores} (torch's default)"
        report_paired(f"{what}, stack tok/s at {args.streams} streams", ours["tput"], base["tput"], "tok/s")
        report_paired(f"{what}, TTFT at concurrency 1", ours["ttft"], base["ttft"], "ms")
        report_paired(f"{what}, one stream's tok/s", ours["solo"], base["solo"], "tok/s")
    finally:
        for engine, pre in stacks.values():
            pre.stop()
            engine.stop()


async def measure(args: argparse.Namespace, clients: dict[str, AsyncSpliceClient]) -> dict[str, dict[str, list]]:
    """Per repeat and stack: tok/s at args.streams, median TTFT at concurrency 1, median one-stream tok/s."""
    batch, wanted = prompts(args.streams), [args.new_tokens] * args.streams
    image = png() if IMAGE in (await clients["ours"].model_info()).input_kinds else None
    figures: dict[str, dict[str, list]] = {name: {"tput": [], "ttft": [], "solo": []} for name in clients}
    for client in clients.values():  # warm both
        await stack_run(client, batch[:4], [4] * 4)
        await first_token_ms(client, image)
    for _ in range(args.repeats):
        for name, client in clients.items():
            figures[name]["tput"].append(await stack_run(client, batch, wanted))
        ttfts: dict[str, list[float]] = {name: [] for name in clients}
        solos: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(TTFT_CALLS):
            for name, client in clients.items():
                ttfts[name].append(await first_token_ms(client, image))
        for _ in range(SOLO_CALLS):
            for name, client in clients.items():
                solos[name].append(await stack_run(client, batch[:1], [2 * args.new_tokens]))
        for name in clients:
            figures[name]["ttft"].append(statistics.median(ttfts[name]))
            figures[name]["solo"].append(statistics.median(solos[name]))
    return figures


if __name__ == "__main__":
    asyncio.run(main())
