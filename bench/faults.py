"""Faults against a stack run by `splice up` (tests/harness/faults.py's scenarios), with figures:

  kill9         engine SIGKILL mid-stream: every running stream ends UNAVAILABLE (target: within 2 s), splice up
                restarts the engine, the next request succeeds.
  sigstop       engine SIGSTOP mid-stream (a hung host): what running streams and a new request see and when;
                SIGCONT: the engine is the same process (nothing restarted) and serves again.
  preprocessor  preprocessor SIGKILL mid-stream: streams end UNAVAILABLE, splice up restarts it on its port, the
                next request succeeds as fast as before (the aborted sequences do not linger in the engine).
  hostile       normal traffic (bench/soak.py's mixed workload) measured clean, then again beside hostile traffic:
                request templates that would run for hours (rendered under a time budget), silent Generate
                streams to the engine and silent Upload streams to the preprocessor that declare large tensors,
                oversized uploads. Prints both p99 latencies and their ratio (target: within 2x) and what
                each kind of hostile request was answered.

    python -m bench.faults [--only kill9,sigstop,preprocessor,hostile] [--streams 8] [--seconds 30] [--quick]

Exit code 0 when every outcome held (the 2 s and 2x targets are printed, not asserted: timings are figures).
"""

from __future__ import annotations

import asyncio
import sys

import torch

from bench.common import bench_parser
from tests.harness.faults import SCENARIOS, run


def main() -> int:
    parser = bench_parser(__doc__, quick={"streams": 2, "seconds": 5}, model=None, repeats=None)
    parser.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated, of {SCENARIOS}")
    parser.add_argument("--streams", type=int, default=8, help="running streams per fault; normal traffic streams")
    parser.add_argument("--seconds", type=float, default=30.0, help="each of the clean and hostile traffic runs")
    args = parser.parse_args()
    only = tuple(s for s in args.only.split(",") if s)
    if unknown := set(only) - set(SCENARIOS):
        parser.error(f"unknown scenarios {sorted(unknown)}")
    torch.set_num_threads(1)
    outcomes = asyncio.run(run(only, args.streams, args.seconds))
    failed = [o.name for o in outcomes if o.problems]
    print(f"{len(outcomes) - len(failed)} of {len(outcomes)} fault scenarios held" +
          (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
