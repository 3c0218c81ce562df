"""Row operations of a hybrid cache: attention layers beside layers with a recurrent state.

transformers builds such a cache from the config (`DynamicCache(config=...)`): key/value layers, linear-attention,
conv and SSM layers (`conv_states` / `recurrent_states`, one tensor per state index, batch first and no time axis)
and placeholder layers holding nothing. Here its key/value layers are the batch's slot layers
(engine/models/slot_cache.py); the states are kept in slot order beside them. A row's recurrent state summarizes
its whole past, so there are no columns: a prefill runs on a fresh cache (new states, the shared slot layers),
joining appends its state rows, a fork appends copies of one row's (the other choices of an n > 1 request), and a
leaving row's slot takes the last row's state (one row copied) before the state tensors are cut to the rows in use (a
view). The model itself rewrites every state on every step.

The state is only right if left padding never entered it: those layers take the 2-D padding mask of the
new positions (`recurrent_mask`), which zeroes padded inputs, not the 4-D attention mask.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

from engine.models.base import StepInputs
from engine.models.slot_cache import SlotKV


def _is_kv(layer: Any) -> bool:
    return isinstance(layer, DynamicLayer) and not isinstance(layer, LinearAttentionCacheLayerMixin)


def _state_dicts(layer: Any) -> list[dict[int, torch.Tensor | None]]:
    """The per-state-index tensors a recurrent layer holds ([rows, ...] each), none for other layers."""
    return [d for d in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)) if d]


class HybridCache:
    """Caches mixing key/value layers (the slots'), recurrent-state layers and placeholders."""

    chunkable = False  # transformers' recurrent layers prefill a whole prompt from an empty state

    def __init__(self, config: Any) -> None:
        self.config = config  # the model's config: which layer holds what

    def new(self, kv: SlotKV) -> DynamicCache:
        cache = DynamicCache(config=self.config)
        for i, layer in enumerate(cache.layers):
            if _is_kv(layer):
                cache.layers[i] = kv.layer(i)
        return cache

    def for_prefill(self, kv: SlotKV, running: DynamicCache | None) -> DynamicCache:
        """New rows start from empty states: a fresh cache, sharing the running batch's key/value layers."""
        return self.new(kv)

    def join(self, running: DynamicCache | None, prefilled: DynamicCache) -> DynamicCache:
        """The prefilled rows' states after the running rows'."""
        if running is None:
            return prefilled
        for la, lb in zip(running.layers, prefilled.layers, strict=True):
            for sa, sb in zip(_state_dicts(la), _state_dicts(lb), strict=True):
                for i, t in sb.items():
                    if t is not None:
                        sa[i] = t if sa[i] is None else torch.cat([sa[i], t])
        return running

    def move(self, cache: DynamicCache, src: int, dst: int) -> None:
        for layer in cache.layers:
            for states in _state_dicts(layer):
                for t in states.values():
                    if t is not None:
                        t[dst] = t[src]

    def fork(self, cache: DynamicCache, src: int, copies: int) -> None:
        """`copies` new rows after the rows in use, each holding row `src`'s states (an n > 1 request's other choices
        start from its prompt's state; the slot layers copy their columns themselves, SlotKV.fork)."""
        for layer in cache.layers:
            for states in _state_dicts(layer):
                for i, t in states.items():
                    if t is not None:
                        states[i] = torch.cat([t, t[src:src + 1].expand(copies, *t.shape[1:])])

    def swap(self, cache: DynamicCache, a: int, b: int) -> None:
        """Rows `a` and `b` trade their states (SlotKV.swap trades their columns)."""
        for layer in cache.layers:
            for states in _state_dicts(layer):
                for t in states.values():
                    if t is not None:
                        t[[a, b]] = t[[b, a]]

    def narrow(self, cache: DynamicCache, rows: int) -> list[tuple[dict, int, torch.Tensor]]:
        """Before a forward of the first `rows` rows only (the others are paused: engine/flow.py): each state
        tensor is cut to them (the model rewrites what it is given); returns the whole tensors, to put the other rows'
        states back after it (`widen`)."""
        aside = []
        for layer in cache.layers:
            for states in _state_dicts(layer):
                for i, t in states.items():
                    if t is not None and t.shape[0] > rows:
                        aside.append((states, i, t))
                        states[i] = t[:rows]
        return aside

    def widen(self, cache: DynamicCache, aside: list[tuple[dict, int, torch.Tensor]]) -> None:
        """After that forward: the first rows' new states, then the others' as they were."""
        for states, i, whole in aside:
            new = states[i]
            rows = new.shape[0]
            if new.data_ptr() != whole.data_ptr():  # (written in place: `whole` holds them already)
                whole = torch.cat([new, whole[rows:]])
            states[i] = whole

    def truncate(self, cache: DynamicCache, rows: int) -> None:
        """Keeps the states of the first `rows` slots (a view; the rest is freed with the next join)."""
        for layer in cache.layers:
            for states in _state_dicts(layer):
                for i, t in states.items():
                    if t is not None:
                        states[i] = t[:rows]

    @staticmethod
    def batch_rows(cache: DynamicCache) -> list[int]:
        """Rows held by every recurrent state tensor (for tests and checks)."""
        return [t.shape[0] for layer in cache.layers for states in _state_dicts(layer) for t in states.values()
                if t is not None]


def recurrent_mask(step: StepInputs) -> torch.Tensor | None:
    """[rows, q] 1 = real position of the new ones, for layers with a recurrent state; None when no new position
    is padding (every decode step), as transformers' create_recurrent_attention_mask gives. Only a prefill pads
    (on the left, so its new positions are the mask's last q columns); a decode step's rows end at different
    columns, but its one new position per row is always real."""
    q = step.token_ids.shape[1]
    mask = step.mask[:, -q:]
    return None if q == 1 or bool(mask.all()) else mask.contiguous()
