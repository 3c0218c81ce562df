"""Peak memory of one prefill of a LEN-token prompt: the engine's runner vs HF's own forward of the same prompt (no
attention mask), each in a fresh process, measured as peak RSS growth over the loaded model; in turns, ratio per
repeat.

    python -m bench.prompt_memory [--model tiny-text] [--len 32768] [--repeats 2] [--quick]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.common import bench_parser, in_turns, prefill, prompts, report


def measure(kind: str, model: str, length: int) -> None:
    """In the fresh process: loads the model, prefills one prompt, prints its peak RSS growth."""
    import torch

    from app.models import resolve_model
    from engine.config import EngineConfig
    from engine.loader import load
    from engine.model_runner import ModelRunner, batch_capacity
    from splice.engine_request import EngineRequest

    torch.set_num_threads(1)
    cfg = EngineConfig(model=str(resolve_model(model)), max_model_len=None)
    loaded = load(cfg)
    family = loaded.family
    ids = prompts(1, lengths=(length, length))[0]
    prompt = family.prompt(EngineRequest("m", ids)) if kind == "ours" else None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.inference_mode():
        if kind == "ours":
            # the engine's runner: its key/value buffers reserved for a full batch (committed only where written)
            prefill(ModelRunner(family, batch_capacity(cfg.max_running_seqs, loaded.info.max_model_len)), [prompt])
        else:
            family.model(input_ids=torch.tensor([ids]), use_cache=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"growth_mib {(peak - before) / 1024:.1f}")


def run(kind: str, model: str, length: int) -> float:
    out = subprocess.run([sys.executable, "-m", "bench.prompt_memory", "--measure", kind, "--model", model,
                          "--len", str(length)], capture_output=True, text=True, check=True).stdout
    return float(next(line for line in out.splitlines() if line.startswith("growth_mib")).split()[1])


def main() -> None:
    parser = bench_parser(__doc__, quick={"len": 512, "repeats": 1}, repeats=2, len=32768)
    parser.add_argument("--measure", choices=["ours", "hf"], help="(internal) one side, in this process")
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.model, args.len)
        return
    mib = in_turns({kind: lambda kind=kind: run(kind, args.model, args.len) for kind in ("ours", "hf")}, args.repeats)
    report(f"{args.model}: peak memory growth of one {args.len}-token prefill vs HF forward", mib["ours"], mib["hf"],
           "MiB")


if __name__ == "__main__":
    main()
