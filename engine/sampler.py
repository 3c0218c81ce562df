"""Next-token choice for a batch: greedy, temperature, top-k, top-p, each row with its own generator.

A row's draw depends only on its logits and its own seeded generator, so a seeded request gives the same
tokens alone or in any batch. Logprobs are of the model's raw distribution (before temperature/top-k/p),
as vLLM reports them by default.
"""

from __future__ import annotations

import random

import torch

from splice.sampling import SamplingParams


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else random.getrandbits(63))
    return g


def _filter(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """[vocab] logits with everything outside top-k / top-p set to -inf."""
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p; the top token always stays
        drop_sorted = (probs.cumsum(-1) - probs) >= p.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


@torch.inference_mode()
def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator]) -> tuple[list[int], list[float | None]]:
    """logits [batch, vocab] -> one token per row, and its logprob for rows that asked."""
    logits = logits.float()
    chosen = logits.argmax(dim=-1)  # [batch]; kept for greedy rows
    for row, (p, g) in enumerate(zip(params, generators, strict=True)):
        if p.greedy:
            continue
        # shifted by the row max first: the largest scaled logit is 0, so no temperature can overflow it
        scaled = _filter((logits[row] - logits[row].max()) / p.temperature, p)  # [vocab]
        chosen[row] = torch.multinomial(scaled.softmax(-1), 1, generator=g)[0]
    want = [p.logprobs for p in params]
    logprobs: list[float | None] = [None] * len(params)
    if any(want):
        picked = logits.log_softmax(-1).gather(1, chosen[:, None])[:, 0].tolist()  # [batch]
        logprobs = [lp if w else None for lp, w in zip(picked, want, strict=True)]
    return chosen.tolist(), logprobs
