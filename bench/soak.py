"""Soak: N concurrent streams for D seconds through the real async client (tests/harness/soak.py's mixed
workload: text, prompt embeddings and images; sampled lengths; greedy and seeded sampling). Passes with 0 errors
and every request's received tokens equal to its usage; prints counts, tok/s, latency and TTFT p50/p99, and both
services' RSS at start and end (growth over a long run would be a leak).

    python -m bench.soak [--streams 64] [--seconds 300] [--target HOST:PORT [--engine HOST:PORT]] [--quick]

Without --target it starts its own stack (--model, one running slot per stream) through the launcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

import torch

from bench.common import bench_parser
from bench.stacks import running_stack
from tests.harness.soak import soak
from tests.harness.up import listening_pid


def main() -> int:
    parser = bench_parser(__doc__, quick={"streams": 4, "seconds": 10}, model="tiny-idefics3", repeats=None,
                          streams=64, seconds=300.0, seed=0)
    parser.add_argument("--target", default=None, help="a running preprocessor (default: start a stack)")
    parser.add_argument("--engine", default=None, help="its engine's HOST:PORT, for its RSS (local only)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with contextlib.ExitStack() as opened:
        services = ()
        if args.target is None:
            services = opened.enter_context(running_stack(
                args.model, engine_args=["--max-running-seqs", str(args.streams)],
                preprocessor_args=["--max-concurrent-requests", str(max(256, 2 * args.streams))]))
            target, pids = services[1].address, {"engine": services[0].proc.pid, "preprocessor": services[1].proc.pid}
        else:
            target = args.target
            pids = {name: pid for name, address in (("engine", args.engine), ("preprocessor", args.target))
                    if address and (pid := listening_pid(int(address.rsplit(":", 1)[1]))) is not None}
        print(f"soak: {args.streams} streams x {args.seconds:.0f} s against {target}", flush=True)
        result = asyncio.run(soak(target, args.streams, args.seconds, pids, args.seed))
        alive = all(s.alive for s in services)
    print(result.report())
    print(f"services alive at the end: {alive}; {'PASS' if result.ok and alive else 'FAIL'}")
    return 0 if result.ok and alive else 1


if __name__ == "__main__":
    sys.exit(main())
