"""Different adapters in one forward: each token gets `x @ A^T @ B^T * scale` of its own adapter, on every layer
the adapter adapts, and tokens without one get nothing added.

A forward declares which adapter each of its tokens runs under (`LoraState.use`: segments of (adapter, tokens) in the
order the forward lays its tokens out, flattened); every adapted layer (a `Site`) then adds its deltas to its output.
As punica's shrink and expand, in plain torch ops and batched over the adapters: a site stacks the A matrices of the
forward's adapters, [columns, in] (each adapter's r rows, per output slice of a fused layer), and their B matrices
block-wise, [out, columns]; a token's shrink `x @ A_all^T` is masked to its own adapter's columns, scaled, and
expanded by `B_all`. Two matrix products per layer whatever the number of adapters (at most --max-loras), and where
some tokens have no adapter only the others are gathered and their deltas added back. A forward with no adapter
token costs one attribute read per layer. Stacks are made once per set of adapters running together.

Sites are made at load (`engine/lora/sites.py`): the fused q/k/v and gate/up linears of Splice's own forward
(engine/models/lean_llama.py), whose output slices take each module's delta, and transformers' nn.Linear modules
(through a forward hook) everywhere else: the language model's layers, the vision tower and the connector.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.lora.adapter import LoraAdapter

STACKS_KEPT = 8  # sets of adapters whose stacks are kept (least recently used dropped)


@dataclass(frozen=True)
class Stack:
    """One site's matrices for one set of adapters."""

    a: torch.Tensor  # [columns, in]: each adapter's lora_A rows, slice after slice
    b: torch.Tensor  # [out, columns]: each adapter's lora_B at its slice's output rows, zero elsewhere
    slot: torch.Tensor  # [columns] long: the adapter (its index in the set) each column belongs to
    scale: torch.Tensor  # [columns]: that adapter's scale for the module
    layout: tuple  # (slot, rank, scale) per block of columns: sites of equal layouts share a forward's masks


class Site:
    """A linear layer adapters may adapt: one module, or several fused into one output (`slices`: each module's path
    and its output columns [start, end))."""

    def __init__(self, state: LoraState, slices: list[tuple[str, int, int]]) -> None:
        self.state = state
        self.slices = slices
        self.out_features = slices[-1][2]

    def stack(self, adapters: tuple[LoraAdapter, ...]) -> Stack | None:
        """The site's matrices for `adapters` (None: none of them adapts it)."""
        a_rows, blocks, layout = [], [], []
        for path, start, end in self.slices:
            for slot, adapter in enumerate(adapters):
                w = adapter.weights.get(path)
                if w is not None:
                    a_rows.append(w.a)
                    blocks.append((start, end, w.b))
                    layout.append((slot, w.rank, w.scale))
        if not a_rows:
            return None
        a = torch.cat(a_rows)
        b = a.new_zeros(self.out_features, a.shape[0])
        at = 0
        for start, end, w in blocks:
            b[start:end, at:at + w.shape[1]] = w
            at += w.shape[1]
        slot = torch.tensor([s for s, r, _ in layout for _ in range(r)], device=a.device)
        scale = torch.tensor([c for _, r, c in layout for _ in range(r)], device=a.device, dtype=a.dtype)
        return Stack(a, b, slot, scale, tuple(layout))

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x [..., in], out [..., out] (this layer's output without adapters) -> out with each token's delta added
        (in place)."""
        batch = self.state.current
        if batch is None:
            return out
        stack = batch.stack(self)
        if stack is None:
            return out
        x2 = x.reshape(-1, x.shape[-1])  # [tokens, in]
        o2 = out.view(-1, out.shape[-1])  # [tokens, out]
        if batch.tokens is not None and x2.shape[0] != batch.tokens:
            path = self.slices[0][0]
            raise RuntimeError(f"LoRA: {path} sees {x2.shape[0]} tokens in a forward of {batch.tokens}; it cannot be "
                               "adapted per token")
        if batch.rows is not None:  # only the tokens that have an adapter
            x2 = x2.index_select(0, batch.rows)
        delta = F.linear(F.linear(x2, stack.a) * batch.mask(stack), stack.b)  # [tokens with an adapter, out]
        if batch.rows is not None:
            o2.index_add_(0, batch.rows, delta)
        else:
            o2.add_(delta)
        return out


@dataclass
class LoraBatch:
    """One forward's tokens and their adapters."""

    adapters: tuple[LoraAdapter, ...]  # the distinct adapters of the forward, in first-seen order
    stacks: dict[Site, Stack | None]  # each site's stack for `adapters`, made at its first use
    tokens: int | None  # the forward's flattened tokens (None: any shape, every token under adapters[0])
    rows: torch.Tensor | None = None  # [k] long: the tokens that have an adapter (None: all of them)
    slots: torch.Tensor | None = None  # [k] long: each such token's adapter (None: all under adapters[0])
    masks: dict[tuple, torch.Tensor] = field(default_factory=dict)  # per column layout, this forward's mask

    def stack(self, site: Site) -> Stack | None:
        if site not in self.stacks:
            self.stacks[site] = site.stack(self.adapters)
        return self.stacks[site]

    def mask(self, stack: Stack) -> torch.Tensor:
        """[k, columns] (or [columns] when every token has one adapter): each token's own adapter's scale on its
        columns, zero on the others'."""
        if self.slots is None:
            return stack.scale
        found = self.masks.get(stack.layout)
        if found is None:
            found = self.masks[stack.layout] = (self.slots[:, None] == stack.slot[None, :]) * stack.scale[None, :]
        return found


class LoraState:
    """The adapters of the forward running now, read by every site of one model (engine thread only)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.current: LoraBatch | None = None
        self._stacks: OrderedDict[tuple[LoraAdapter, ...], dict[Site, Stack | None]] = OrderedDict()

    def _stacks_for(self, adapters: tuple[LoraAdapter, ...]) -> dict[Site, Stack | None]:
        found = self._stacks.get(adapters)
        if found is None:
            found = self._stacks[adapters] = {}
            while len(self._stacks) > STACKS_KEPT:
                self._stacks.popitem(last=False)
        self._stacks.move_to_end(adapters)
        return found

    def batch(self, segments: list[tuple[LoraAdapter | None, int]]) -> LoraBatch | None:
        """The forward whose flattened tokens are `segments` (adapter, count) in order; None when none has one."""
        adapters = tuple(dict.fromkeys(a for a, n in segments if a is not None and n))
        if not adapters:
            return None
        tokens = sum(n for _, n in segments)
        out = LoraBatch(adapters, self._stacks_for(adapters), tokens)
        if len(adapters) == 1 and all(a is not None for a, n in segments if n):
            return out
        index = {a: i for i, a in enumerate(adapters)}
        slots = torch.repeat_interleave(torch.tensor([index.get(a, -1) for a, _ in segments]),
                                        torch.tensor([n for _, n in segments])).to(self.device)
        if any(a is None for a, n in segments if n):
            out.rows = torch.nonzero(slots >= 0).flatten()
            slots = slots[out.rows]
        out.slots = slots
        return out

    @contextmanager
    def use(self, segments: list[tuple[LoraAdapter | None, int]]) -> Iterator[None]:
        """Runs the block as the forward of `segments`."""
        self.current = self.batch(segments)
        try:
            yield
        finally:
            self.current = None

    @contextmanager
    def whole(self, adapter: LoraAdapter | None) -> Iterator[None]:
        """Runs the block (a vision tower's call, any shapes) with every token under `adapter`."""
        self.current = None if adapter is None else LoraBatch((adapter,), self._stacks_for((adapter,)), None)
        try:
            yield
        finally:
            self.current = None
