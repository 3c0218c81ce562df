"""Row operations of a left-padded HF DynamicCache (TGI's CausalLM concatenate / filter).

Every layer holds keys/values [rows, kv_heads, T, head_dim], left-padded to a common T. Keys are
cached after RoPE, so padding never shifts positions.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class PaddedKVCache:
    """new / join / leave for caches whose every layer is a plain (full) key/value layer."""

    def new(self) -> DynamicCache:
        return DynamicCache()

    def join(self, a: DynamicCache, b: DynamicCache, pad_a: int, pad_b: int) -> DynamicCache:
        """Rows of `b` after those of `a`; each side left-padded by its count of columns."""
        for la, lb in zip(a.layers, b.layers, strict=True):
            la.keys = torch.cat([left_pad(la.keys, pad_a, 2), left_pad(lb.keys, pad_b, 2)])
            la.values = torch.cat([left_pad(la.values, pad_a, 2), left_pad(lb.values, pad_b, 2)])
        return a

    def leave(self, cache: DynamicCache, rows: torch.Tensor, first: int) -> None:
        """Keeps `rows` and the columns from `first` on (the ones before are padding in every kept row)."""
        for layer in cache.layers:
            layer.keys = layer.keys[rows, :, first:].contiguous()
            layer.values = layer.values[rows, :, first:].contiguous()
