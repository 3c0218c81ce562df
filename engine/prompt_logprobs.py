"""Prompt logprobs (SamplingParams.prompt_logprobs = k): scored in the prefill forwards of the one request that asks,
from the hidden states of every position of its prompt; every other prompt keeps the last position's logits only.

The runner (engine/model_runner.py) hands `score` each forward's hidden states of such a prompt, [q, hidden] for
positions [start, start + q): one piece for a prompt prefilled at once, one per chunk of a long one (over several
steps, or packed beside decoding rows). Position p's hidden state gives the logits of the token at p + 1; those
logits are made, log-softmaxed and reduced to (logprob of the prompt's token, its rank, the k most likely) in
chunks of at most LOGIT_ELEMENTS // vocab positions, so no [positions, vocab] tensor larger than one chunk's ever
exists, however long the prompt. The pieces go back with the step's output and wait on the sequence's record
(`PromptScores`: a forward run again replaces what it scored); `finish` joins them once the prompt is complete. The
values are of the model's raw distribution, as vLLM's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.models.base import ModelFamily, Prompt
from splice.prompt_logprobs import PromptLogprobs

# Logits held at once per chunk (float32): 2^24 elements = 64 MiB, e.g. 341 positions of a 49k vocabulary, 110 of
# Qwen's 152k.
LOGIT_ELEMENTS = 1 << 24

# (start, logprobs [n], ranks [n], top IDs [n, k], top logprobs [n, k]) of prompt positions [start, start + n), on
# the CPU
Piece = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@torch.inference_mode()
def score(family: ModelFamily, prompt: Prompt, hidden: torch.Tensor, start: int) -> Piece | None:
    """hidden [q, hidden] of prompt positions [start, start + q) -> this piece's scores; None when none of them
    predicts a prompt token (the last position)."""
    k = prompt.prompt_logprobs
    assert k is not None
    stop = min(start + hidden.shape[0], len(prompt.token_ids) - 1)  # the last position predicts no prompt token
    if stop <= start:
        return None
    targets = prompt.token_ids[start + 1:stop + 1]  # [n]: the token each position predicts
    rows = max(1, LOGIT_ELEMENTS // family.embed.weight.shape[0])  # positions per chunk of logits
    hidden = hidden[:stop - start]
    parts = [_score(family, hidden[at:at + rows], targets[at:at + rows], k) for at in range(0, stop - start, rows)]
    return (start, *(torch.cat(t) for t in zip(*parts, strict=True)))


def _score(family: ModelFamily, hidden: torch.Tensor, targets: torch.Tensor,
           k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [n, hidden], targets [n] -> on the CPU: logprobs [n], ranks [n], top IDs [n, k], top logprobs [n, k]."""
    lp = family.logits(hidden).float().log_softmax(-1)  # [n, vocab]
    picked = lp.gather(1, targets[:, None])  # [n, 1]
    ranks = (lp >= picked).sum(-1)  # [n]: tokens at least as likely, vLLM's rank
    values, ids = lp.topk(min(k, lp.shape[-1]), dim=-1)  # [n, k], most likely first
    return picked[:, 0].cpu(), ranks.cpu(), ids.cpu(), values.cpu()


@dataclass
class PromptScores:
    """One prompt's logprobs as its forwards score them; `result` once it is complete, until its first token takes
    them out."""

    token_ids: Sequence[int]  # the prompt's
    pieces: list[Piece] = field(default_factory=list)
    result: PromptLogprobs | None = None

    def add(self, piece: Piece) -> None:
        """A forward's piece; one run again (a failed packed step, a failed group) replaces what it scored."""
        self.pieces = [p for p in self.pieces if p[0] < piece[0]] + [piece]

    def finish(self) -> None:
        """The whole prompt's logprobs from the pieces (which go)."""
        pieces, self.pieces = self.pieces, []
        n = len(self.token_ids) - 1
        got = sum(p[1].numel() for p in pieces)
        if got != n:
            raise RuntimeError(f"prompt logprobs: recorded {got} of {n} positions")
        ids = tuple(self.token_ids)
        if not pieces:
            self.result = PromptLogprobs(ids)
            return
        logprobs, ranks, top, values = (torch.cat(t) for t in zip(*(p[1:] for p in pieces), strict=True))
        self.result = PromptLogprobs(ids, tuple(logprobs.tolist()), tuple(ranks.tolist()),
                                     tuple(top.flatten().tolist()), tuple(values.flatten().tolist()))
