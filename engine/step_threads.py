"""torch's intra-op threads per engine step: every usable CPU for a step that prefills many prompt positions, the
usual count (the CPUs less one, engine/config.py auto_torch_threads) for every other.

Why: a step's cost with many prompt positions is its matrix products, which scale with the cores (SmolLM2's packed
linears at 256 rows on two cores: 1.97x in float32, 1.90x in bfloat16; at 64 rows 1.87x / 1.81x), and while a lone
prompt prefills no token streams, so the core left to the serving loop and a co-located preprocessor is idle. A
decode step is many small ops, memory-bound ones among them, that two threads do not speed up: SmolLM2's 16-row
bfloat16 decode step took 55.8 ms on one thread, 57.9 on two (its attention's copies and softmax slower), and its
tokens' streaming needs that core.

The count is set on the engine thread before the step's forward (torch.set_num_threads: OpenMP's setting for the
calling thread, read by oneDNN when a product runs), and only when it changes.
"""

from __future__ import annotations

import torch

PREFILL_THREADS_AT = 64  # prompt positions in a step from which it runs on the prefill threads


class StepThreads:
    """`usual` threads for a step, `prefill` for a step of PREFILL_THREADS_AT prompt positions or more."""

    def __init__(self, usual: int, prefill: int) -> None:
        self.usual = usual
        self.prefill = prefill
        self.current: int | None = None  # what this thread was last set to (None: not yet)

    def count(self, positions: int) -> int:
        """The threads for a step of `positions` prompt positions."""
        return self.prefill if positions >= PREFILL_THREADS_AT else self.usual

    def set_for(self, positions: int) -> None:
        """Sets the calling thread's torch threads for a step of `positions` prompt positions."""
        n = self.count(positions)
        if n != self.current:
            torch.set_num_threads(n)
            self.current = n
