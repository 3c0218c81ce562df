"""Structured outputs on the engine: each constrained sequence's grammar matcher, its mask on a step's logits, and
the matcher's advance with every chosen token.

One bitmask tensor per step ([rows, ceil(vocab / 32)] int32, reused) holds the allowed tokens of every row that has a
grammar; xgrammar fills each such row from its matcher and applies the mask to all of them in one call. The mask is
applied before the penalties and the sampler (vLLM's order), so the chosen token's logprob is of the masked
distribution, as vLLM reports it. Used by the engine thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq

import torch
import xgrammar as xgr

from engine.sequence import Sequence

log = logging.getLogger(__name__)


class GrammarMasks:
    """The step's bitmask; each constrained sequence's matcher is on its record (`Sequence.matcher`)."""

    def __init__(self) -> None:
        self._bitmask: torch.Tensor | None = None  # [rows, words], grown as needed

    @staticmethod
    def start(seq: Sequence) -> None:
        """`seq` decodes under its grammar from its first token."""
        seq.matcher = xgr.GrammarMatcher(seq.grammar)

    @torch.no_grad()
    def apply(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
        """logits [rows, vocab] (row i is seqs[i]'s) -> a float32 copy with each constrained row's disallowed tokens
        at -inf; `logits` itself when no row has a grammar."""
        rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
        if not rows:
            return logits
        vocab = logits.shape[-1]
        words = (vocab + 31) // 32
        if self._bitmask is None or self._bitmask.shape[0] < len(seqs) or self._bitmask.shape[1] != words:
            self._bitmask = xgr.allocate_token_bitmask(max(len(seqs), 8), vocab)
        bitmask = self._bitmask[:len(seqs)]
        for i in rows:
            seqs[i].matcher.fill_next_token_bitmask(bitmask, i)
        x = logits.to(torch.float32, copy=True)
        xgr.apply_token_bitmask_inplace(x, bitmask.to(x.device, non_blocking=True), indices=rows)
        return x

    @staticmethod
    def advance(seqs: Seq[Sequence], tokens: Seq[int]) -> set[int]:
        """Each constrained row's matcher takes its token; returns the rows whose grammar is complete (their output
        ends: finish_reason stop)."""
        done: set[int] = set()
        for row, (seq, token) in enumerate(zip(seqs, tokens, strict=True)):
            matcher = seq.matcher
            if matcher is None or seq.is_finished:
                continue
            if not matcher.accept_token(token):  # cannot happen while the mask is applied; end rather than go astray
                log.warning("request %s: token %d left its grammar; ending it", seq.request_id, token)
                done.add(row)
            elif matcher.is_terminated():
                done.add(row)
        return done
