"""Prompt logprobs (SamplingParams.prompt_logprobs = k): gathered in the prefill forwards of the one request that asks,
from the hidden states of every position of its prompt; every other prompt keeps the last position's logits only.

The runner (engine/model_runner.py) hands `record` each forward's hidden states of such a prompt, [q, hidden] for
positions [start, start + q): one piece for a prompt prefilled at once, one per chunk of a long one (over several
steps, or packed beside decoding rows). Position p's hidden state gives the logits of the token at p + 1; those
logits are made, log-softmaxed and reduced to (logprob of the prompt's token, its rank, the k most likely) in
chunks of at most LOGIT_ELEMENTS // vocab positions, so no [positions, vocab] tensor larger than one chunk's ever
exists, however long the prompt. The pieces wait on the Prompt (a retried forward replaces what it recorded);
`finish` joins them once the prompt is complete. The values are of the model's raw distribution, as vLLM's.
"""

from __future__ import annotations

import torch

from engine.models.base import ModelFamily, Prompt
from splice.prompt_logprobs import PromptLogprobs

# Logits held at once per chunk (float32): 2^24 elements = 64 MiB, e.g. 341 positions of a 49k vocabulary, 110 of
# Qwen's 152k.
LOGIT_ELEMENTS = 1 << 24


def wants(prompt: Prompt) -> bool:
    return prompt.prompt_logprobs is not None


@torch.inference_mode()
def record(family: ModelFamily, prompt: Prompt, hidden: torch.Tensor, start: int) -> None:
    """hidden [q, hidden] of prompt positions [start, start + q) -> this piece's scores, kept on `prompt`."""
    k = prompt.prompt_logprobs
    assert k is not None
    stop = min(start + hidden.shape[0], len(prompt.token_ids) - 1)  # the last position predicts no prompt token
    pieces = [p for p in prompt.logprob_pieces if p[0] < start]  # a forward run again replaces its own piece
    if stop > start:
        targets = prompt.token_ids[start + 1:stop + 1]  # [n]: the token each position predicts
        rows = max(1, LOGIT_ELEMENTS // family.embed.weight.shape[0])  # positions per chunk of logits
        hidden = hidden[:stop - start]
        parts = [_score(family, hidden[at:at + rows], targets[at:at + rows], k) for at in range(0, stop - start, rows)]
        pieces.append((start, *(torch.cat(t) for t in zip(*parts, strict=True))))
    prompt.logprob_pieces = pieces


def _score(family: ModelFamily, hidden: torch.Tensor, targets: torch.Tensor,
           k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [n, hidden], targets [n] -> on the CPU: logprobs [n], ranks [n], top IDs [n, k], top logprobs [n, k]."""
    lp = family.logits(hidden).float().log_softmax(-1)  # [n, vocab]
    picked = lp.gather(1, targets[:, None])  # [n, 1]
    ranks = (lp >= picked).sum(-1)  # [n]: tokens at least as likely, vLLM's rank
    values, ids = lp.topk(min(k, lp.shape[-1]), dim=-1)  # [n, k], most likely first
    return picked[:, 0].cpu(), ranks.cpu(), ids.cpu(), values.cpu()


def finish(prompt: Prompt) -> PromptLogprobs:
    """The whole prompt's logprobs from its recorded pieces (which it drops)."""
    pieces, prompt.logprob_pieces = prompt.logprob_pieces, []
    n = len(prompt.token_ids) - 1
    got = sum(p[1].numel() for p in pieces)
    if got != n:
        raise RuntimeError(f"prompt logprobs: recorded {got} of {n} positions")
    if not pieces:
        return PromptLogprobs(tuple(prompt.token_ids.tolist()))
    logprobs, ranks, ids, values = (torch.cat(t) for t in zip(*(p[1:] for p in pieces), strict=True))
    return PromptLogprobs(tuple(prompt.token_ids.tolist()), tuple(logprobs.tolist()), tuple(ranks.tolist()),
                          tuple(ids.flatten().tolist()), tuple(values.flatten().tolist()))
