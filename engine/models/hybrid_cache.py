"""Row operations of a hybrid cache: attention layers beside layers with a recurrent state.

transformers builds such a cache from the config (`DynamicCache(config=...)`): key/value layers
([rows, kv_heads, T, head_dim], left-padded to a common T, as in padded_cache.py), linear-attention, conv
and SSM layers (`conv_states` / `recurrent_states`, one tensor per state index, batch first and no time
axis) and placeholder layers holding nothing. A row's recurrent state summarizes its whole past, so
joining concatenates rows and leaving keeps rows: there are no columns to pad or trim.

The state is only right if left padding never entered it: those layers take the 2-D padding mask of the
new positions (`recurrent_mask`), which zeroes padded inputs, not the 4-D attention mask.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from engine.models.base import StepInputs
from engine.models.padded_cache import left_pad


def _has_kv(layer: Any) -> bool:
    return getattr(layer, "keys", None) is not None


def _state_dicts(layer: Any) -> list[dict[int, torch.Tensor | None]]:
    """The per-state-index tensors a recurrent layer holds ([rows, ...] each), none for other layers."""
    return [d for d in (getattr(layer, "conv_states", None), getattr(layer, "recurrent_states", None)) if d]


class HybridCache:
    """new / join / leave for caches mixing key/value layers, recurrent-state layers and placeholders."""

    def __init__(self, config: Any) -> None:
        self.config = config  # the model's config: which layer holds what

    def new(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def join(self, a: DynamicCache, b: DynamicCache, pad_a: int, pad_b: int) -> DynamicCache:
        """Rows of `b` after those of `a`: key/values left-padded by each side's count of columns, states
        concatenated on the batch dimension."""
        for la, lb in zip(a.layers, b.layers, strict=True):
            if _has_kv(la):
                la.keys = torch.cat([left_pad(la.keys, pad_a, 2), left_pad(lb.keys, pad_b, 2)])
                la.values = torch.cat([left_pad(la.values, pad_a, 2), left_pad(lb.values, pad_b, 2)])
            for sa, sb in zip(_state_dicts(la), _state_dicts(lb), strict=True):
                for i, t in sa.items():
                    if t is not None:
                        sa[i] = torch.cat([t, sb[i]])
        return a

    def leave(self, cache: DynamicCache, rows: torch.Tensor, first: int) -> None:
        """Keeps `rows` (their states, and key/value columns from `first` on); the others' state is freed now."""
        for layer in cache.layers:
            if _has_kv(layer):
                layer.keys = layer.keys[rows, :, first:].contiguous()
                layer.values = layer.values[rows, :, first:].contiguous()
            for states in _state_dicts(layer):
                for i, t in states.items():
                    if t is not None:
                        states[i] = t[rows].contiguous()

    @staticmethod
    def batch_rows(cache: DynamicCache) -> list[int]:
        """Rows held by every recurrent state tensor (for tests and checks)."""
        return [t.shape[0] for layer in cache.layers for states in _state_dicts(layer) for t in states.values()
                if t is not None]


def recurrent_mask(step: StepInputs) -> torch.Tensor | None:
    """[rows, q] 1 = real position of the new ones, for layers with a recurrent state; None when no new position
    is padding (every decode step), as transformers' create_recurrent_attention_mask gives."""
    mask = step.mask[:, -step.token_ids.shape[1]:]
    return None if bool(mask.all()) else mask.contiguous()
