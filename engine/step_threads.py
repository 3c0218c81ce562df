"""torch's intra-op threads in the engine: the usual count (the CPUs less one, engine/config.py auto_torch_threads)
for most ops, and the compute count (every usable CPU) for the packed matrix products of every step
(engine/models/linear.py) and for every op of a step that prefills PREFILL_STEP_AT prompt positions or more.

Why: matrix products scale with the cores, at decode sizes too, where they stream the weights from memory and two
cores draw more bandwidth than one (SmolLM2's packed linears on two cores: at one row 1.55x float32, 1.40x bfloat16;
at 256 rows 1.97x / 1.90x), while a decode step's small ops, memory-bound copies and softmax among them, do not
(SmolLM2's 16-row bfloat16 decode step with every op on two threads: 55.8 -> 57.9 ms, its attention slower). The
core left to the serving loop and a co-located preprocessor is lent for the products only, and for whole prefill
steps, during which no token streams from a lone prompt. Measured through the stack on two CPUs (`splice up`'s
engine and preprocessor, one client streaming 400 tokens over HTTP): time per output token 52.2 -> 38.2 ms float32,
34.4 -> 28.5 ms bfloat16; docs/performance.md has vLLM's benchmark before and after.

torch.set_num_threads is OpenMP's setting for the calling thread (the engine thread, which runs the forwards),
read by oneDNN when a product runs; it is set only when it changes.
"""

from __future__ import annotations

import torch

from engine.models import linear

PREFILL_STEP_AT = 64  # prompt positions in a step from which all of it runs on the compute threads


class StepThreads:
    """`usual` threads for a step's small ops, `compute` for its packed products and for a step of PREFILL_STEP_AT
    prompt positions or more. Made by the engine at start (it sets the products' count, process-wide as torch's
    threads are); `close` at its stop."""

    def __init__(self, usual: int, compute: int) -> None:
        self.usual = usual
        self.compute = compute
        self.current: int | None = None  # what this thread was last set to (None: not yet)
        linear.product_threads(compute)

    def count(self, positions: int) -> int:
        """The threads for a step of `positions` prompt positions (its products aside)."""
        return self.compute if positions >= PREFILL_STEP_AT else self.usual

    def set_for(self, positions: int) -> None:
        """Sets the calling thread's torch threads for a step of `positions` prompt positions."""
        n = self.count(positions)
        if n != self.current:
            torch.set_num_threads(n)
            self.current = n

    def close(self) -> None:
        linear.product_threads(None)
