"""Different adapters in one forward: each token gets `x @ A^T @ B^T * scale` of its own adapter, on every layer
the adapter adapts, and tokens without one get nothing added.

A forward declares which adapter each of its tokens runs under (`LoraState.use`: segments of (adapter, tokens) in the
order the forward lays its tokens out, flattened); every adapted layer (a `Site`) then adds its deltas to its output.
As punica's shrink and expand, in plain torch ops and batched over the adapters: a site stacks the A matrices of the
forward's adapters, [columns, in] (each adapter's r rows, per output slice of a fused layer), and their B matrices per
output slice; a token's shrink `x @ A_all^T` is masked to its own adapter's columns, scaled, and expanded by each
slice's `B` into that slice of the output (in place). One shrink and one expand per output slice, whatever the number
of adapters (at most --max-loras), and where some tokens have no adapter only the others are gathered and their deltas
added back. A forward with no adapter
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

from engine.lora.adapter import LoraAdapter

STACKS_KEPT = 8  # sets of adapters whose stacks are kept (least recently used dropped)


@dataclass(frozen=True)
class Stack:
    """One site's matrices for one set of adapters."""

    a: torch.Tensor  # [in, columns]: each adapter's lora_A^T, slice after slice (a slice's columns are contiguous)
    # per output slice with an adapter: (its output columns [start, end), its columns [c0, c1), its adapters' lora_B^T
    # stacked [c1 - c0, end - start]); the expand is one product per slice, never over another slice's zeros
    blocks: tuple[tuple[int, int, int, int, torch.Tensor], ...]
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
        at = 0
        for path, start, end in self.slices:
            found = [(slot, w) for slot, adapter in enumerate(adapters) if (w := adapter.weights.get(path)) is not None]
            if not found:
                continue
            a_rows += [w.a for _, w in found]
            width = sum(w.rank for _, w in found)
            blocks.append((start, end, at, at + width, torch.cat([w.b for _, w in found], 1).t().contiguous()))
            layout += [(slot, w.rank, w.scale) for slot, w in found]
            at += width
        if not a_rows:
            return None
        a = torch.cat(a_rows).t().contiguous()
        slot = torch.tensor([s for s, r, _ in layout for _ in range(r)], device=a.device)
        scale = torch.tensor([c for _, r, c in layout for _ in range(r)], device=a.device, dtype=a.dtype)
        return Stack(a, tuple(blocks), slot, scale, tuple(layout))

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
        rows = batch.rows
        if rows is not None:  # only the tokens that have an adapter
            x2 = x2.index_select(0, rows)
        h = torch.mm(x2, stack.a).mul_(batch.mask(stack))  # [tokens with an adapter, columns]: shrink, own, scaled
        for start, end, c0, c1, b in stack.blocks:  # expand, slice by slice
            if rows is None:
                o2[:, start:end].addmm_(h[:, c0:c1], b)
            else:
                o2[:, start:end].index_add_(0, rows, torch.mm(h[:, c0:c1], b))
        return out


@dataclass
class LoraBatch:
    """One forward's tokens and their adapters."""

    adapters: tuple[LoraAdapter, ...]  # the distinct adapters of the forward, by name
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


def _order(adapter: LoraAdapter) -> tuple[str, int]:
    return adapter.name, id(adapter)


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
        # in one order whatever the rows' (by name, then load): a set of adapters has one stack per site
        adapters = tuple(sorted({a for a, n in segments if a is not None and n}, key=_order))
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
