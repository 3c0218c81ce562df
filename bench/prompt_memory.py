"""Row 6: peak memory of one prefill of a LEN-token prompt: the engine's runner vs HF's own forward of the same
prompt (no attention mask), each in a fresh process, measured as peak RSS growth over the loaded model.

    python -m bench.prompt_memory [--model tiny-text] [--len 32768] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")


def measure(kind: str, model: str, length: int) -> None:
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
    ids = torch.randint(40, 600, (length,), generator=torch.Generator().manual_seed(0))
    prompt = family.prompt(EngineRequest("m", ids.tolist())) if kind == "ours" else None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.inference_mode():
        if kind == "ours":
            # the engine's runner: its key/value buffers reserved for a full batch (committed only where written)
            ModelRunner(family, batch_capacity(cfg.max_running_seqs, loaded.info.max_model_len)).prefill([0], [prompt])
        else:
            family.model(input_ids=ids[None], use_cache=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"growth_mib {(peak - before) / 1024:.1f}")


def run(kind: str, model: str, length: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--measure", kind, "--model", model, "--len", str(length)],
                         capture_output=True, text=True, check=True).stdout
    return float(next(line for line in out.splitlines() if line.startswith("growth_mib")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-text")
    parser.add_argument("--len", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--measure", choices=["ours", "hf"])
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.model, args.len)
        return
    from bench.measure import report

    ours, base = [], []
    for _ in range(args.repeats):
        ours.append(run("ours", args.model, args.len))
        base.append(run("hf", args.model, args.len))
    report(f"{args.model}: peak memory growth of one {args.len}-token prefill vs HF forward", ours, base, "MiB")


if __name__ == "__main__":
    main()
