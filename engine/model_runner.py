"""Batched prefill and decode over one padded KV cache (TGI's CausalLM concatenate / filter, on HF models).

The running batch is one HF DynamicCache whose rows are sequences, left-padded to a common length, with
a [rows, T] mask of real positions. A prefill builds a batch for the new sequences and concatenates it
in (padding the shorter side on the left); a leaving sequence is filtered out at once, and columns that
became padding in every row are trimmed. Keys are cached after RoPE, so padding never shifts positions;
each row carries its own position ids. Masks are additive 4D tensors built here, with the dtype's min
instead of -inf so a padding query row stays finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from engine.loader import LoadedModel


@dataclass
class Batch:
    seq_ids: list[int]  # row order
    cache: DynamicCache  # per layer keys/values [rows, kv_heads, T, head_dim], left-padded
    mask: torch.Tensor  # [rows, T] long; 1 = real position, 0 = padding
    positions: torch.Tensor  # [rows] long; position id of each row's next token

    @property
    def width(self) -> int:
        return self.mask.shape[1]


def _left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _concat(a: Batch, b: Batch) -> Batch:
    width = max(a.width, b.width)
    pa, pb = width - a.width, width - b.width
    for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
        la.keys = torch.cat([_left_pad(la.keys, pa, 2), _left_pad(lb.keys, pb, 2)])
        la.values = torch.cat([_left_pad(la.values, pa, 2), _left_pad(lb.values, pb, 2)])
    mask = torch.cat([_left_pad(a.mask, pa, 1), _left_pad(b.mask, pb, 1)])
    return Batch(a.seq_ids + b.seq_ids, a.cache, mask, torch.cat([a.positions, b.positions]))


class ModelRunner:
    def __init__(self, m: LoadedModel) -> None:
        self.m = m
        self.batch: Batch | None = None
        self._min = torch.finfo(m.dtype).min

    @property
    def seq_ids(self) -> list[int]:
        return list(self.batch.seq_ids) if self.batch else []

    def _attn_mask(self, mask: torch.Tensor, q: int) -> torch.Tensor:
        """mask [rows, T] (T includes the q new columns) -> additive [rows, 1, q, T]."""
        width = mask.shape[1]
        key_col = torch.arange(width, device=mask.device)
        query_col = torch.arange(width - q, width, device=mask.device)
        allowed = (key_col[None, :] <= query_col[:, None])[None] & mask[:, None, :].bool()  # [rows, q, T]
        out = torch.zeros(allowed.shape, dtype=self.m.dtype, device=mask.device)
        return out.masked_fill_(~allowed, self._min)[:, None]

    def _forward(self, embeds: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: DynamicCache) -> torch.Tensor:
        """embeds [rows, q, hidden], mask [rows, T], positions [rows, q] -> last-position logits [rows, vocab]."""
        out = self.m.backbone(
            inputs_embeds=embeds,
            attention_mask=self._attn_mask(mask, embeds.shape[1]),
            position_ids=positions,
            cache=cache,  # past_key_values before transformers 5.24, which also dropped cache_position
            use_cache=True,
        )
        return self.m.lm_head(out.last_hidden_state[:, -1]).float()

    @torch.inference_mode()
    def prefill(self, seq_ids: list[int], prompts: list[torch.Tensor]) -> torch.Tensor:
        """prompts: one [prompt_len, hidden] per sequence -> logits [len(seq_ids), vocab]; the rows join the batch.

        On an exception the running batch is untouched.
        """
        dev = self.m.device
        longest = max(p.shape[0] for p in prompts)
        embeds = torch.stack([_left_pad(p, longest - p.shape[0], 0) for p in prompts])  # [n, longest, hidden]
        lengths = torch.tensor([p.shape[0] for p in prompts], device=dev)
        mask = (torch.arange(longest, device=dev)[None, :] >= (longest - lengths)[:, None]).long()  # [n, longest]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [n, longest]
        cache = DynamicCache()
        logits = self._forward(embeds, mask, positions, cache)
        new = Batch(list(seq_ids), cache, mask, lengths.clone())
        self.batch = new if self.batch is None else _concat(self.batch, new)
        return logits

    @torch.inference_mode()
    def decode(self, tokens: list[int]) -> torch.Tensor:
        """tokens: the last token of every row, in `seq_ids` order -> logits [rows, vocab]."""
        b = self.batch
        assert b is not None and len(tokens) == len(b.seq_ids)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.m.device)  # [rows]
        embeds = self.m.embed(ids)[:, None].to(self.m.dtype)  # [rows, 1, hidden]
        mask = torch.cat([b.mask, b.mask.new_ones(len(tokens), 1)], dim=1)  # [rows, T + 1]
        logits = self._forward(embeds, mask, b.positions[:, None], b.cache)
        b.mask = mask
        b.positions = b.positions + 1
        return logits

    def remove(self, seq_ids: set[int]) -> None:
        """Drops rows (their KV freed now) and the columns that are padding in every remaining row."""
        b = self.batch
        if b is None or not seq_ids & set(b.seq_ids):
            return
        keep = [i for i, s in enumerate(b.seq_ids) if s not in seq_ids]
        if not keep:
            self.batch = None
            return
        rows = torch.tensor(keep, device=self.m.device)
        mask = b.mask[rows]
        first = int(mask.any(0).long().argmax())  # first column real in some row
        for layer in b.cache.layers:
            layer.keys = layer.keys[rows, :, first:].contiguous()
            layer.values = layer.values[rows, :, first:].contiguous()
        b.seq_ids = [b.seq_ids[i] for i in keep]
        b.mask = mask[:, first:].contiguous()
        b.positions = b.positions[rows]
