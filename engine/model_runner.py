"""Batched prefill and decode over one running batch; everything model-specific is the family's.

The running batch is one cache whose rows are sequences, left-padded to a common length, with a
[rows, T] mask of real positions and each row's next position id. A prefill builds a batch for the new
sequences and joins it in (padding the shorter side on the left); a leaving sequence is dropped at once,
and columns that became padding in every row are trimmed. The family (engine/models/) says what a
position id is, which masks each layer type gets, what extra inputs the forward takes, and how its
cache's rows are joined and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.models import ModelFamily, Prompt, StepInputs
from engine.models.padded_cache import left_pad


@dataclass
class Batch:
    seq_ids: list[int]  # row order
    cache: Any  # the family's cache (a left-padded DynamicCache by default)
    mask: torch.Tensor  # [rows, T] long; 1 = real position, 0 = padding
    positions: torch.Tensor  # [rows] long; position id of each row's next token

    @property
    def width(self) -> int:
        return self.mask.shape[1]


class ModelRunner:
    def __init__(self, family: ModelFamily) -> None:
        self.family = family
        self.batch: Batch | None = None

    @property
    def seq_ids(self) -> list[int]:
        return list(self.batch.seq_ids) if self.batch else []

    def _forward(self, embeds: torch.Tensor, step: StepInputs, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """embeds [rows, q, hidden], positions [D, rows, q] -> last-position logits [rows, vocab]."""
        f = self.family
        out = f.backbone(
            inputs_embeds=embeds,
            attention_mask=f.attention_mask(step),
            position_ids=positions[0] if f.position_dims == 1 else positions,
            cache=cache,
            use_cache=True,
            **f.forward_kwargs(step, embeds),
        )
        return f.logits(out.last_hidden_state[:, -1])

    @torch.inference_mode()
    def prefill(self, seq_ids: list[int], prompts: list[Prompt]) -> torch.Tensor:
        """One merged Prompt per sequence -> logits [len(seq_ids), vocab]; the rows join the batch.

        On an exception the running batch is untouched.
        """
        dev = self.family.device
        longest = max(len(p.token_ids) for p in prompts)
        pads = [longest - len(p.token_ids) for p in prompts]
        embeds = torch.stack([left_pad(p.embeds, n, 0) for p, n in zip(prompts, pads, strict=True)])  # [n, L, hidden]
        lengths = torch.tensor([len(p.token_ids) for p in prompts], device=dev)
        mask = (torch.arange(longest, device=dev)[None, :] >= (longest - lengths)[:, None]).long()  # [n, L]
        step = StepInputs(
            token_ids=torch.stack([left_pad(p.token_ids, n, 0) for p, n in zip(prompts, pads, strict=True)]),
            mask=mask,
            image_mask=torch.stack([left_pad(p.image_mask, n, 0) for p, n in zip(prompts, pads, strict=True)]),
            span_mask=torch.stack([left_pad(p.span_mask, n, 0) for p, n in zip(prompts, pads, strict=True)]),
        )
        positions = torch.stack([left_pad(p.positions, n, 1) for p, n in zip(prompts, pads, strict=True)], 1)
        cache = self.family.cache.new()
        logits = self._forward(embeds, step, positions, cache)  # positions: [D, n, L]
        new = Batch(list(seq_ids), cache, mask, torch.tensor([p.next_position for p in prompts], device=dev))
        self.batch = new if self.batch is None else self._join(self.batch, new)
        return logits

    def _join(self, a: Batch, b: Batch) -> Batch:
        width = max(a.width, b.width)
        pa, pb = width - a.width, width - b.width
        cache = self.family.cache.join(a.cache, b.cache, pa, pb)
        mask = torch.cat([left_pad(a.mask, pa, 1), left_pad(b.mask, pb, 1)])
        return Batch(a.seq_ids + b.seq_ids, cache, mask, torch.cat([a.positions, b.positions]))

    @torch.inference_mode()
    def decode(self, tokens: list[int]) -> torch.Tensor:
        """tokens: the last token of every row, in `seq_ids` order -> logits [rows, vocab]."""
        b = self.batch
        f = self.family
        assert b is not None and len(tokens) == len(b.seq_ids)
        ids = torch.tensor(tokens, dtype=torch.long, device=f.device)[:, None]  # [rows, 1]
        embeds = f.lookup(ids)  # [rows, 1, hidden]
        mask = torch.cat([b.mask, b.mask.new_ones(len(tokens), 1)], dim=1)  # [rows, T + 1]
        positions = b.positions[None, :, None].expand(f.position_dims, -1, 1)  # [D, rows, 1]
        logits = self._forward(embeds, StepInputs(ids, mask, None, None), positions, b.cache)
        b.mask = mask
        b.positions = b.positions + 1
        return logits

    def remove(self, seq_ids: set[int]) -> None:
        """Drops rows (their cache freed now) and the columns that are padding in every remaining row."""
        b = self.batch
        if b is None or not seq_ids & set(b.seq_ids):
            return
        keep = [i for i, s in enumerate(b.seq_ids) if s not in seq_ids]
        if not keep:
            self.batch = None
            return
        rows = torch.tensor(keep, device=self.family.device)
        mask = b.mask[rows]
        first = int(mask.any(0).long().argmax())  # first column real in some row
        self.family.cache.leave(b.cache, rows, first)
        b.seq_ids = [b.seq_ids[i] for i in keep]
        b.mask = mask[:, first:].contiguous()
        b.positions = b.positions[rows]
