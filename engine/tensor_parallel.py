"""Tensor parallelism: N ranks on torch.distributed, each holding a shard of the model by transformers' own
tensor-parallel plan (`from_pretrained(..., tp_plan="auto")`; gloo on CPU, NCCL on GPU).

Rank 0 is the engine: it serves gRPC and schedules. Before each model call (a prompt's merge, a step's decode and
prefill, rows leaving) it sends the call and its inputs to the other ranks, which run the very same call:
every forward must run on every rank with identical inputs — one rank alone blocks on the collectives until
its peers die, and different inputs give silently wrong logits. The messages travel over a gloo group of their
own, serialized with torch.save, so each rank loads the tensors onto its own device.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from splice.errors import FailedPrecondition

log = logging.getLogger(__name__)

# The model calls every rank runs, by the role of the object they are made on.
LOCKSTEP_CALLS: dict[str, tuple[str, ...]] = {"runner": ("execute", "remove", "clear"),
                                               "family": ("prompt",)}
INIT_TIMEOUT = timedelta(minutes=10)  # loading a large checkpoint on every rank


def check_plan(config: Any) -> None:
    """FailedPrecondition when transformers has no tensor-parallel plan for `config`'s text model."""
    text = config.get_text_config()
    if not (getattr(text, "base_model_tp_plan", None) or getattr(config, "base_model_tp_plan", None)):
        raise FailedPrecondition(f"{config.model_type}: transformers has no tensor-parallel plan for this model; "
                                 "serve it with --tensor-parallel-size 1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Channel:
    """Rank 0 -> every other rank: one message per model call (None = stop), over a gloo group."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.group = dist.new_group(backend="gloo")

    def send(self, message: Any) -> None:
        buf = io.BytesIO()
        torch.save(message, buf)
        data = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
        dist.broadcast(torch.tensor([data.numel()]), src=0, group=self.group)
        dist.broadcast(data, src=0, group=self.group)

    def receive(self) -> Any:
        size = torch.zeros(1, dtype=torch.long)
        dist.broadcast(size, src=0, group=self.group)
        data = torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(data, src=0, group=self.group)
        return torch.load(io.BytesIO(data.numpy().tobytes()), map_location=self.device, weights_only=False)


class Lockstep:
    """Wraps rank 0's runner or family: its model calls are sent to every other rank before they run here;
    everything else (attributes, properties) is the wrapped object's."""

    def __init__(self, role: str, target: Any, channel: Channel) -> None:
        object.__setattr__(self, "_role", role)
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_channel", channel)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name not in LOCKSTEP_CALLS[self._role]:
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self._channel.send((self._role, name, args, kwargs))
            return value(*args, **kwargs)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)


def follow(channel: Channel, targets: dict[str, Any]) -> None:
    """A worker rank's loop: run each call rank 0 sends until it sends None. A call that fails here failed on
    rank 0 too (same inputs), where it is answered."""
    while (message := channel.receive()) is not None:
        role, name, args, kwargs = message
        try:
            getattr(targets[role], name)(*args, **kwargs)
        except Exception:
            log.debug("rank %d: %s.%s failed (as on rank 0)", dist.get_rank(), role, name, exc_info=True)


class Ranks:
    """Rank 0's view: starts the worker ranks, joins the process group, and stops them."""

    def __init__(self, size: int, cfg: Any) -> None:
        from transformers import AutoConfig

        check_plan(AutoConfig.from_pretrained(cfg.model))  # before any rank starts
        self.size = size
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(size)}
        os.environ.update({**env, "RANK": "0", "LOCAL_RANK": "0"})
        config = json.dumps(dataclasses.asdict(cfg))
        self.workers = [subprocess.Popen([sys.executable, "-m", "engine.tp_worker", config],
                                         env={**os.environ, **env, "RANK": str(r), "LOCAL_RANK": str(r)})
                        for r in range(1, size)]
        self._stopping = False
        for proc in self.workers:
            threading.Thread(target=self._watch, args=(proc,), daemon=True).start()
        dist.init_process_group(backend=backend(cfg.device), timeout=INIT_TIMEOUT)
        self.channel: Channel | None = None

    def _watch(self, proc: subprocess.Popen) -> None:
        code = proc.wait()
        if not self._stopping:
            # Every forward needs every rank: without this one the engine cannot compute anything, and would
            # block in its next collective. Exit, so that a supervisor restarts the whole engine.
            log.error("tensor-parallel rank (pid %d) exited with %s; the engine stops", proc.pid, code)
            os._exit(1)

    def wrap(self, runner: Any, family: Any, device: torch.device) -> tuple[Any, Any]:
        self.channel = Channel(device)
        return Lockstep("runner", runner, self.channel), Lockstep("family", family, self.channel)

    def stop(self) -> None:
        self._stopping = True
        if self.channel is not None:
            self.channel.send(None)
        for proc in self.workers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        dist.destroy_process_group()


def backend(device: str) -> str:
    return "nccl" if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()) else "gloo"


def watch_parent(on_orphan: Callable[[], None] = lambda: os._exit(0)) -> None:
    """A worker rank ends when rank 0 is gone (killed: it cannot say stop), instead of blocking forever."""
    parent = os.getppid()

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        on_orphan()

    threading.Thread(target=poll, daemon=True).start()
