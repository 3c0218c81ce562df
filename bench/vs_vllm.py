"""Splice vs vLLM on the same machine, weights and cores, loaded by vLLM's own benchmark client.

For each dtype and round, each server runs alone on the model folder: vLLM (`vllm serve FOLDER --dtype D`, its CPU
build, from the venv given by --vllm-venv) and Splice (`splice up`'s engine and preprocessor with the HTTP face, the
same dtype). Against each, `vllm bench serve --backend openai --dataset-name random --random-input-len IN
--random-output-len OUT --ignore-eos` runs at every concurrency (num-prompts = 2 x concurrency, after a warm-up
request); the server is stopped before the other starts, and rounds alternate which goes first. Printed per dtype and
concurrency: each server's output tok/s, TTFT and TPOT medians (median [min..max] over rounds), and Splice / vLLM
taken per round.

    python -m bench.vs_vllm --vllm-venv /path/to/vllm-venv
    python -m bench.vs_vllm --vllm-venv V --dtypes bfloat16 --concurrency 16 --rounds 3

vLLM is not a dependency of Splice and this script installs nothing; docs/performance.md says how to make the venv.
Both servers run as they start by default on this machine: Splice's engine with the CPUs less one torch thread,
vLLM's CPU build with its OpenMP threads on the CPUs less the one it reserves for its front end (one each on two
CPUs). Each server's first request after it answers (a 4-token completion) is timed too.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.launch import start_stack
from app.models import resolve_model
from bench.common import bench_parser, spread
from bench.vllm_server import bench_serve, check_venv, vllm_server

SERVED = "model"  # the name both servers answer to (vLLM's and Splice's --served-model-name)


@dataclass(frozen=True)
class Figures:
    """One `vllm bench serve` run."""

    out_tok_s: float
    ttft_ms: float  # median
    tpot_ms: float  # median


@contextmanager
def splice_server(folder: Path, dtype: str, port: int) -> Iterator[str]:
    """Splice's stack (engine + preprocessor with its HTTP face) on `folder` -> the HTTP base URL; stopped on exit.
    A running slot for every stream the largest concurrency sends."""
    engine, pre = start_stack(str(folder), http_port=port,
                              engine_args=["--dtype", dtype, "--max-model-len", "2048", "--max-running-seqs", "64"],
                              preprocessor_args=["--served-model-name", SERVED])
    try:
        yield f"http://{pre.http_address}"
    finally:
        pre.stop()
        engine.stop()


def run_bench(venv: Path, base: str, folder: Path, concurrency: int, input_len: int, output_len: int,
              out_dir: Path) -> Figures:
    """`vllm bench serve` at `concurrency` (2 x concurrency prompts) against `base` -> its figures."""
    name = f"c{concurrency}-{time.monotonic_ns()}.json"
    run = bench_serve(venv, ["--backend", "openai", "--base-url", base, "--model", SERVED, "--tokenizer", str(folder),
                             "--dataset-name", "random", "--random-input-len", str(input_len),
                             "--random-output-len", str(output_len), "--ignore-eos",
                             "--num-prompts", str(2 * concurrency), "--max-concurrency", str(concurrency),
                             "--seed", "0", "--save-result", "--result-dir", str(out_dir), "--result-filename", name])
    if run.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    result = json.loads((out_dir / name).read_text())
    if result.get("completed") != 2 * concurrency:
        raise RuntimeError(f"{result.get('completed')} of {2 * concurrency} requests completed against {base}")
    return Figures(result["output_throughput"], result["median_ttft_ms"], result["median_tpot_ms"])


def first_request(base: str) -> float:
    """Seconds of a short first request (its lazy set-up a measurement should not pay; and what a user waits for
    first once the server is up)."""
    body = json.dumps({"model": SERVED, "prompt": "Hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"content-type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()
    return time.perf_counter() - start


def main() -> None:
    parser = bench_parser(__doc__, quick={"rounds": 1, "concurrency": [1], "output_len": 16},
                          model="smollm2-135m-instruct", repeats=None)
    parser.add_argument("--vllm-venv", type=Path, required=True, help="a venv with vLLM's CPU build (not Splice's)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--port", type=int, default=8391, help="the HTTP port each server takes in turn")
    parser.add_argument("--only", choices=["splice", "vllm"], help="measure one server (no ratio)")
    args = parser.parse_args()
    venv = check_venv(args.vllm_venv)
    folder = Path(resolve_model(args.model)).resolve()
    servers = {"vllm": lambda dt: vllm_server(venv, str(folder), name=SERVED, dtype=dt, port=args.port),
               "splice": lambda dt: splice_server(folder, dt, args.port)}
    if args.only:
        servers = {args.only: servers[args.only]}
    out_dir = Path(tempfile.mkdtemp(prefix="vs-vllm-"))
    print(f"model {folder.name}, input {args.input_len}, output {args.output_len} tokens, --ignore-eos, "
          f"{os.cpu_count()} CPUs; vllm bench serve's results in {out_dir}", flush=True)
    figures: dict[tuple[str, str, int], list[Figures]] = {}
    for dtype in args.dtypes:
        for r in range(args.rounds):
            names = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in names:
                with servers[name](dtype) as base:
                    print(f"  {dtype} round {r + 1} {name:6} first request: {first_request(base) * 1e3:.0f} ms",
                          flush=True)
                    for c in args.concurrency:
                        f = run_bench(venv, base, folder, c, args.input_len, args.output_len, out_dir)
                        figures.setdefault((name, dtype, c), []).append(f)
                        print(f"  {dtype} round {r + 1} {name:6} c={c:3}: {f.out_tok_s:7.2f} tok/s, TTFT "
                              f"{f.ttft_ms:8.1f} ms, TPOT {f.tpot_ms:7.1f} ms", flush=True)
    print_table(figures, args.dtypes, args.concurrency, list(servers))


def print_table(figures: dict[tuple[str, str, int], list[Figures]], dtypes: list[str], concurrency: list[int],
                names: list[str]) -> None:
    print("\n| dtype | concurrency | " + " | ".join(f"{n} out tok/s" for n in names)
          + (" | Splice / vLLM (per round) | TTFT median vLLM / Splice ms | TPOT median vLLM / Splice ms |"
             if len(names) == 2 else " |"))
    print("|---" * (2 + len(names) + (3 if len(names) == 2 else 0)) + "|")
    for dtype in dtypes:
        for c in concurrency:
            row = [dtype, str(c)] + [spread([f.out_tok_s for f in figures[(n, dtype, c)]]) for n in names]
            if len(names) == 2:
                ours, base = figures[("splice", dtype, c)], figures[("vllm", dtype, c)]
                ratios = [o.out_tok_s / b.out_tok_s for o, b in zip(ours, base, strict=True)]
                row += [f"**{statistics.median(ratios):.2f}** [{min(ratios):.2f}..{max(ratios):.2f}]",
                        f"{spread([b.ttft_ms for b in base])} / {spread([o.ttft_ms for o in ours])}",
                        f"{spread([b.tpot_ms for b in base])} / {spread([o.tpot_ms for o in ours])}"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
