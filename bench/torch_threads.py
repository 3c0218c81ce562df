"""The engine's default torch threads (`--torch-threads` unset: this host's CPUs less one) vs torch's own default
(every core), each engine beside its preprocessor on this host as `splice up` runs them: two stacks up at once,
measured in turns, ratio per repeat.

    python -m bench.torch_threads [--model tiny-text] [--streams 64] [--new-tokens 64] [--repeats 3]
                                  [--stream-interval 1] [--engine-args '...'] [--quick]

Three figures per repeat: whole-stack tok/s at STREAMS concurrent streams (bench.stack_throughput's requests); TTFT
at concurrency 1 (median of 20 one-token chats, one image for a vision model); one stream's tok/s (median of 3).
Neither stack gets $OMP_NUM_THREADS, so the engines choose as a user's would.
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import time

from bench.common import in_turns_async, png, prompts, report
from bench.stacks import side_by_side, stack_parser, stack_run
from clients import AsyncSpliceClient, image_part, text_part
from engine.config import usable_cpus
from splice.model_info import IMAGE

TTFT_CALLS = 20
SOLO_CALLS = 3


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
    async with side_by_side(args, {"ours": [], "torch": ["--torch-threads", str(cores)]}) as clients:
        figures = await measure(args, clients)
    what = f"{args.model}: engine at its default torch threads vs --torch-threads {cores} (torch's default)"
    for key, label, unit in (("tput", f"stack tok/s at {args.streams} streams", "tok/s"),
                             ("ttft", "TTFT at concurrency 1", "ms"), ("solo", "one stream's tok/s", "tok/s")):
        report(f"{what}, {label}", figures[key]["ours"], figures[key]["torch"], unit)


async def measure(args, clients: dict[str, AsyncSpliceClient]) -> dict[str, dict[str, list[float]]]:
    """Per figure, stack -> its value per repeat: tok/s at args.streams, median TTFT at concurrency 1, median
    one-stream tok/s."""
    batch, wanted = prompts(args.streams), [args.new_tokens] * args.streams
    image = png() if IMAGE in (await clients["ours"].model_info()).input_kinds else None
    ttft = {name: functools.partial(first_token_ms, client, image) for name, client in clients.items()}
    solo = {name: functools.partial(stack_run, client, batch[:1], [2 * args.new_tokens])
            for name, client in clients.items()}
    await in_turns_async(ttft, 1)  # warm the image path too
    figures = {"tput": await in_turns_async({name: functools.partial(stack_run, client, batch, wanted)
                                             for name, client in clients.items()}, args.repeats),
               "ttft": {name: [] for name in clients}, "solo": {name: [] for name in clients}}
    for _ in range(args.repeats):
        for key, sides, calls in (("ttft", ttft, TTFT_CALLS), ("solo", solo, SOLO_CALLS)):
            for name, values in (await in_turns_async(sides, calls)).items():
                figures[key][name].append(statistics.median(values))
    return figures


if __name__ == "__main__":
    asyncio.run(main())
