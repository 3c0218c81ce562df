"""Faults against a stack run by `splice up` (its supervision is part of what is tested), with figures: the
scenarios of tests/harness/faults.py (listed below), each printed with its figures and whether its outcomes held.

    python -m bench.faults [--only kill9,sigstop,preprocessor,hostile] [--streams 8] [--seconds 30] [--quick]

Exit code 0 when every outcome held (the 2 s and 2x targets are printed, not asserted: timings are figures).
"""

from __future__ import annotations

import asyncio
import sys

import torch

from bench.common import bench_parser
from tests.harness import faults
from tests.harness.faults import SCENARIOS, run


def main() -> int:
    parser = bench_parser(f"{__doc__}\n{faults.__doc__}", quick={"streams": 2, "seconds": 5}, model=None, repeats=None)
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
