"""Row operations of a hybrid HF DynamicCache built from the config (Nemotron-H: Mamba2 + attention + MoE).

Layers come in three kinds: key/value layers [rows, kv_heads, T, head_dim], left-padded to a common T as in
padded_cache.py; recurrent (linear-attention) layers holding conv_states [rows, conv_dim, kernel] and
recurrent_states [rows, heads, head_dim, state] with no time axis, so rows only concatenate and index on
the batch dimension; and placeholders (MoE / MLP layers) holding nothing. A cache built without the config
has no recurrent layers and fails at the first Mamba layer.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DummyLayer, LinearAttentionCacheLayerMixin

from engine.models.padded_cache import left_pad


def _cat(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return None if a is None or b is None else torch.cat([a, b])


class ConfigCache:
    """new / join / leave for caches whose layers are key/value, recurrent or placeholder layers."""

    def __init__(self, text_config: Any) -> None:
        self.text_config = text_config

    def new(self) -> DynamicCache:
        return DynamicCache(config=self.text_config)

    def join(self, a: DynamicCache, b: DynamicCache, pad_a: int, pad_b: int) -> DynamicCache:
        """Rows of `b` after those of `a`; key/value layers left-padded by each side's count of columns."""
        for la, lb in zip(a.layers, b.layers, strict=True):
            if isinstance(la, DummyLayer):
                continue
            if isinstance(la, LinearAttentionCacheLayerMixin):
                for i in range(la.number_of_states):
                    la.conv_states[i] = _cat(la.conv_states[i], lb.conv_states[i])
                    la.recurrent_states[i] = _cat(la.recurrent_states[i], lb.recurrent_states[i])
                continue
            la.keys = torch.cat([left_pad(la.keys, pad_a, 2), left_pad(lb.keys, pad_b, 2)])
            la.values = torch.cat([left_pad(la.values, pad_a, 2), left_pad(lb.values, pad_b, 2)])
        return a

    def leave(self, cache: DynamicCache, rows: torch.Tensor, first: int) -> None:
        """Keeps `rows` (states freed now for the others) and, in key/value layers, the columns from `first` on."""
        for layer in cache.layers:
            if isinstance(layer, DummyLayer):
                continue
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                for i in range(layer.number_of_states):
                    if layer.conv_states[i] is not None:
                        layer.conv_states[i] = layer.conv_states[i][rows].contiguous()
                    if layer.recurrent_states[i] is not None:
                        layer.recurrent_states[i] = layer.recurrent_states[i][rows].contiguous()
                continue
            layer.keys = layer.keys[rows, :, first:].contiguous()
            layer.values = layer.values[rows, :, first:].contiguous()
