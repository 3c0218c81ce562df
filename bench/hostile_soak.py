"""Issue 40's soak: N normal streaming clients over HTTP (chat, completions, chat with a picture) for a clean stretch,
then the same clients for D seconds beside a loop of the issue's hostile inputs (tests/harness/hostile_soak.py: deep
JSON, 60,000 tools, 2M logit_bias entries, 10M allowed_token_ids, 64 KiB grammars, readers that never read, prompt
logprobs of 1500-token prompts, 64 choices, a large whole answer...), sent from a process of its own. Printed: each
stretch's requests, errors and latency p50/p99 and their p99 ratio; each hostile input's statuses; each process's RSS
at the loop's start and once the engine is idle after it. Passes with 0 normal errors, no hostile 5xx, p99 within 2x
the clean one and each RSS within 10% of its start.

    python -m bench.hostile_soak [--model tiny-qwen2-vl] [--streams 32] [--seconds 300] [--clean 120]
                                 [--only silent_readers,prompt_logprobs,...] [--quick]

The stack: --max-running-seqs 192 (the normal streams and the paused readers' slots), --max-seqs-per-request 16,
--unread-timeout 30, the hermes tool parser; every other flag at its default.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import shlex
import sys
import time

from app.scrape import metrics_address, scrape, value
from bench.common import bench_parser
from bench.stacks import running_stack
from tests.harness.hostile_soak import Run, after, hostile_bodies, hostile_loop, normal_clients, until
from tests.harness.up import rss_mib

SILENT = ["silent_readers", "prompt_logprobs"]


async def _idle(engine) -> None:
    """Until the engine runs and queues nothing (what the loop left has ended or been aborted)."""
    while True:
        samples = await asyncio.to_thread(scrape, engine)
        if not any(value(samples, f"splice_engine_num_requests_{k}") for k in ("running", "waiting")):
            return
        await asyncio.sleep(0.5)


def _attack(metrics: str, address: str, deadline: float, only: list[str] | None) -> Run:
    """The hostile loop until `deadline` (see `until`), in a process of its own: the attacker is another client. In
    the normal clients' event loop, building and sending its bodies (60,000 tools, 2M logit_bias entries, 10M allowed
    IDs: hundreds of ms each, holding that loop) stalled their reads, and the stall counted in their latency as if the
    services had made it."""
    run = Run()
    asyncio.run(hostile_loop(metrics, address, until(deadline), run, only))
    return run


async def _soak(args, engine, pre) -> tuple[Run, Run, dict[str, tuple[float, float]], str]:
    base = f"http://{pre.http_address}"
    clean = Run()
    await normal_clients(base, args.streams, after(args.clean), clean, args.seed)
    pids = {"engine": engine.proc.pid, "preprocessor": pre.proc.pid}
    start = {name: rss_mib(pid) for name, pid in pids.items()}
    hostile = Run()
    deadline = time.monotonic() + args.seconds
    only = [n for n in args.only.split(",") if n] if args.only else None
    attacker = multiprocessing.get_context("spawn").Pool(1)  # its own process: see _attack
    try:
        attack = attacker.apply_async(_attack, (metrics_address(engine), pre.http_address, deadline, only))
        await normal_clients(base, args.streams, until(deadline), hostile, args.seed + 1)
        attacked = await asyncio.to_thread(attack.get)
    finally:
        attacker.terminate()
    hostile.windows, hostile.hostile = attacked.windows, attacked.hostile
    await _idle(engine)
    await asyncio.sleep(5)  # (the preprocessor's last answers leave)
    samples = await asyncio.to_thread(scrape, engine)
    caches = ", ".join(f"{name} {value(samples, name):.0f}" for name in (
        "splice_engine_prefix_cache_blocks", "splice_engine_encoder_cache_bytes"))
    return clean, hostile, {name: (start[name], rss_mib(pid)) for name, pid in pids.items()}, caches


def main() -> int:
    names = [*hostile_bodies(64), *SILENT]
    parser = bench_parser(__doc__, quick={"streams": 4, "seconds": 30.0, "clean": 10.0}, model="tiny-qwen2-vl",
                          repeats=None, streams=32, seconds=300.0, clean=120.0, seed=0)
    parser.add_argument("--engine-args", default="--prefix-cache-mb 16",
                        help="more engine flags (default: a prefix cache of 16 MiB, which normal traffic fills in the "
                             "clean stretch: its pages stay, bounded by the flag, and would hide anything else; 64 "
                             "MiB was 35-80%% full when the loop began)")
    parser.add_argument("--only", default="", help=f"comma-separated hostile inputs, of {names} (default: all)")
    args = parser.parse_args()
    if unknown := {n for n in args.only.split(",") if n} - set(names):
        parser.error(f"unknown inputs {sorted(unknown)}")
    with running_stack(args.model, http_port=0, engine_args=[
            "--metrics-port", "0", "--max-running-seqs", "192", "--max-seqs-per-request", "16",
            "--unread-timeout", "30", *shlex.split(args.engine_args)], preprocessor_args=[
            "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--max-concurrent-requests", "512"],
    ) as (engine, pre):
        print(f"hostile soak on {args.model}: {args.streams} streams, {args.clean:.0f} s clean then "
              f"{args.seconds:.0f} s beside the hostile loop", flush=True)
        clean, hostile, rss, caches = asyncio.run(_soak(args, engine, pre))
        alive = engine.alive and pre.alive
    ratio = hostile.pct(99) / clean.pct(99)
    print(f"clean:   {clean.summary()}")
    print(f"hostile: {hostile.summary()}")
    print(f"p99 {hostile.pct(99):.2f} s vs {clean.pct(99):.2f} s clean: {ratio:.2f}x")
    print("normal p99 while each hostile input was served: " + ", ".join(
        f"{name} {p99:.2f} s" for name, p99 in sorted(hostile.during().items(), key=lambda kv: -kv[1])))
    print(f"engine at the end: {caches}")
    for name, (a, b) in rss.items():
        print(f"{name} RSS {a:.0f} MiB at the loop's start -> {b:.0f} MiB after it ({(b - a) / a:+.1%})")
    server_errors = {n: s for n, statuses in hostile.hostile.items() for s in statuses if isinstance(s, int) and
                     s >= 500}
    ok = (alive and not hostile.errors and not clean.errors and not server_errors and ratio <= 2.0
          and all(b <= 1.1 * a for a, b in rss.values()))
    print(f"services alive: {alive}; hostile 5xx: {server_errors or 'none'}; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
