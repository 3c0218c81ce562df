"""Property-based fuzzing (hypothesis) of a running preprocessor's public faces: every gRPC RPC with raw bytes,
mutated valid messages and structured requests with hostile values (tests/harness/fuzz_grpc.py), and the HTTP
routes with hostile JSON bodies (tests/harness/fuzz_http.py). Passes when every gRPC answer is a defined status
(never UNKNOWN or INTERNAL), no HTTP answer is a 5xx, and the service serves a good request after each batch.

    python -m bench.fuzz [--face grpc|http|both] [--target HOST:PORT] [--http-target HOST:PORT] [--examples 300]
                         [--seed 0] [--quick]

Without targets it starts its own stack (--model, HTTP face on). Prints counts per RPC / route and status.
"""

from __future__ import annotations

import contextlib
import sys
import time

from bench.common import bench_parser
from bench.stacks import running_stack
from tests.harness.fuzz_grpc import Fuzzer
from tests.harness.fuzz_http import HttpFuzzer


def main() -> int:
    parser = bench_parser(__doc__, quick={"examples": 5}, model="tiny-idefics3", repeats=None)
    parser.add_argument("--face", choices=("grpc", "http", "both"), default="both")
    parser.add_argument("--target", default=None, help="HOST:PORT of the gRPC face")
    parser.add_argument("--http-target", default=None, help="HOST:PORT of the HTTP face")
    parser.add_argument("--api-key", default=None, help="the HTTP face's key, if it has one")
    parser.add_argument("--examples", type=int, default=300, help="hypothesis examples per RPC / route (x3 calls)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    began = time.monotonic()
    fuzzers: list = []
    ok = True
    with contextlib.ExitStack() as opened:
        services = ()
        target, http_target = args.target, args.http_target
        if (args.face != "http" and target is None) or (args.face != "grpc" and http_target is None):
            services = opened.enter_context(running_stack(args.model, http_port=0,
                                                          engine_args=["--max-running-seqs", "8"]))
            target, http_target = services[1].address, services[1].http_address
        if args.face != "http":
            fuzzers.append(Fuzzer(target))
            ok &= fuzzers[-1].run(args.examples, args.seed)
        if args.face != "grpc":
            fuzzers.append(HttpFuzzer(f"http://{http_target}", args.api_key))
            ok &= fuzzers[-1].run(args.examples, args.seed)
            fuzzers[-1].close()
        alive = all(s.alive for s in services)
    undefined = [line for f in fuzzers for line in f.undefined]
    total = sum(sum(f.counts.values()) for f in fuzzers)
    for f in fuzzers:
        for (where, code), n in sorted(f.counts.items(), key=str):
            print(f"{where:22s} {code!s:20s} {n}")
    print(f"{total} calls in {time.monotonic() - began:.0f} s; undefined answers: {len(undefined)}; "
          f"processes alive: {alive}; served after every batch: {ok or bool(undefined)}")
    for line in undefined[:20]:
        print("  " + line)
    return 0 if ok and alive else 1


if __name__ == "__main__":
    sys.exit(main())
