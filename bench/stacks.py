"""Whole stacks for the bench scripts (engine and preprocessor processes on loopback, through app.launch), and the
A/B harness: one stack per variant of the engine's flags, all up at once, measured in turns.

- `stack_parser`: the options every whole-stack bench takes (--streams, --new-tokens, --stream-interval,
  --engine-args beside --model and --repeats);
- `running_stack`: a stack as they ask (a running slot for every stream), stopped on exit;
- `stack_run`: N concurrent Complete streams (greedy unless told), each for its own token count: tokens/s;
- `side_by_side`: one stack per variant, each with a client and warmed, for `bench.common.in_turns_async`. Two
  stacks up at once and measured in turns rather than one after the other keep the drift of a shared machine's
  load out of their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

import torch

from app.launch import Service, start_stack
from bench.common import BenchParser, bench_parser, prompts
from clients import AsyncSpliceClient

QUICK = {"streams": 4, "new_tokens": 8, "repeats": 1}


def stack_parser(doc: str, quick: Mapping[str, object] = QUICK, **defaults: object) -> BenchParser:
    """bench_parser with the whole-stack options; `defaults` replaces some of their defaults."""
    parser = bench_parser(doc, quick=quick)
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams (a running slot each)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens each stream asks for")
    parser.add_argument("--stream-interval", type=int, default=1, help="the engine's --stream-interval")
    parser.add_argument("--engine-args", default="", help="more engine flags, e.g. '--mixed-prefill-tokens 2048'")
    parser.set_defaults(**defaults)
    return parser


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The engine's flags as `stack_parser`'s options ask: a running slot for every stream."""
    return ["--max-running-seqs", str(args.streams), "--stream-interval", str(args.stream_interval),
            *shlex.split(args.engine_args)]


def setup(args: argparse.Namespace) -> str:
    """The flags a figure was measured with, for its printed line."""
    return ", ".join([*([f"--stream-interval {args.stream_interval}"] if args.stream_interval > 1 else []),
                      *([args.engine_args] if args.engine_args else [])]) or "default flags"


@contextlib.contextmanager
def running_stack(model: str, **kwargs) -> Iterator[tuple[Service, Service]]:
    """app.launch.start_stack(model, **kwargs) -> (engine, preprocessor), both stopped on exit."""
    engine, pre = start_stack(model, **kwargs)
    try:
        yield engine, pre
    finally:
        pre.stop()
        engine.stop()


def lengths(n: int, new_tokens: int, varied: bool, seed: int = 1) -> list[int]:
    """Each stream's token count: NEW_TOKENS for all, or (varied) drawn from 8..2*NEW_TOKENS-8 (mean NEW_TOKENS)."""
    if not varied:
        return [new_tokens] * n
    g = torch.Generator().manual_seed(seed)
    return torch.randint(8, max(9, 2 * new_tokens - 7), (n,), generator=g).tolist()


async def stack_run(client: AsyncSpliceClient, batch: list[list[int]], wanted: list[int], **sampling) -> float:
    """One concurrent ignore_eos Complete stream per prompt, each for its `wanted` tokens, greedy unless `sampling`
    says otherwise (it goes to every request): tokens/s."""
    sampling = {"temperature": 0.0, **sampling}

    async def one(ids: list[int], n: int) -> int:
        return sum([len(c.token_ids) async for c in client.complete([ids], ignore_eos=True, max_tokens=n,
                                                                     **sampling)])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(ids, n) for ids, n in zip(batch, wanted, strict=True)))
    assert counts == wanted, counts
    return sum(counts) / (time.perf_counter() - start)


async def warm(client: AsyncSpliceClient) -> None:
    """A few short streams: the first calls' one-off costs (connections, allocations) stay out of the figures."""
    await stack_run(client, prompts(4, seed=99), [4] * 4)


@contextlib.asynccontextmanager
async def side_by_side(args: argparse.Namespace, variants: Mapping[str, Sequence[str]]
                       ) -> AsyncIterator[dict[str, AsyncSpliceClient]]:
    """One stack per variant (`stack_parser`'s engine flags, then the variant's), all up at once, each with a warmed
    client: variant -> client. Everything is stopped on exit."""
    with contextlib.ExitStack() as services:
        clients: dict[str, AsyncSpliceClient] = {}
        for name, flags in variants.items():
            _, pre = services.enter_context(running_stack(args.model, engine_args=[*engine_flags(args), *flags]))
            clients[name] = AsyncSpliceClient(pre.address, timeout=600)
        try:
            for client in clients.values():
                await warm(client)
            yield clients
        finally:
            for client in clients.values():
                await client.close()
