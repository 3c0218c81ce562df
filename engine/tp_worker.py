"""A tensor-parallel worker rank (`python -m engine.tp_worker CONFIG_JSON`), started by rank 0's Ranks: it joins the
process group, loads its shard of the same model, and runs every model call rank 0 sends until told to stop."""

from __future__ import annotations

import json
import logging
import sys

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.loader import load
from engine.model_runner import ModelRunner, batch_capacity
from engine.tensor_parallel import INIT_TIMEOUT, Channel, backend, follow, watch_parent


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s tp-rank %(process)d %(name)s: %(message)s")
    cfg = EngineConfig(**json.loads(argv[0]))
    watch_parent()
    dist.init_process_group(backend=backend(cfg.device), timeout=INIT_TIMEOUT)
    torch.set_grad_enabled(False)
    loaded = load(cfg)
    channel = Channel(loaded.device)
    runner = ModelRunner(loaded.family, batch_capacity(cfg.max_running_seqs, loaded.info.max_model_len))
    follow(channel, {"runner": runner, "family": loaded.family})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
