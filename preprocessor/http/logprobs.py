"""Logprobs in vLLM's JSON: a prompt's `prompt_logprobs` list, and the completions `logprobs` object of generated
tokens (echoed prompt tokens first, with `echo`), built as vLLM 0.33 builds them (serving_completion's
_create_completion_logprobs, logprobs.append_logprobs_for_next_position) so the same request reads the same.

vLLM keeps each position's logprobs as a dict keyed by token ID, the position's own token (prompt token or chosen
one) first, then its alternatives (the most likely, or the logprob_token_ids); an ID already in it keeps its place.
A Step is that dict as items, in that order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from splice.prompt_logprobs import PromptLogprobs

TokenTexts = Callable[[Sequence[int]], list[str]]  # token IDs -> each token's own text
MIN_LOGPROB = -9999.0  # vLLM's JSON stand-in for -inf (JSON has no infinity)
# (token ID, its logprob or None at prompt position 0, the position's dict as (ID, logprob) items, token's first)
Step = tuple[int, float | None, tuple[tuple[int, float], ...]]


def clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def _items(token: int, logprob: float, others: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """vLLM's dict of a position, by token ID: `token` first, then `others` (a repeated ID keeps its first place and
    takes the later value)."""
    d = {token: logprob}
    for tid, lp in others:
        d[tid] = lp
    return tuple(d.items())


def prompt_steps(plp: PromptLogprobs) -> list[Step]:
    """A whole prompt's positions as steps: position 0 without a logprob, then each token with its k most likely."""
    steps: list[Step] = []
    for e in plp.entries():
        if e is None:
            steps.append((plp.token_ids[0], None, ()))
        else:
            token, lp, _, tops = e
            steps.append((token, lp, _items(token, lp, tops)))
    return steps


def output_steps(token_ids: Sequence[int], logprobs: Sequence[float], top_ids: Sequence[int],
                 top_logprobs: Sequence[float]) -> list[Step]:
    """Generated tokens as steps: each chosen token with its alternatives (k per token in the flat lists)."""
    k = len(top_ids) // len(token_ids) if token_ids else 0
    return [(t, lp, _items(t, lp, zip(top_ids[i * k:(i + 1) * k], top_logprobs[i * k:(i + 1) * k], strict=True)))
            for i, (t, lp) in enumerate(zip(token_ids, logprobs, strict=True))]


def completion_logprobs(steps: Sequence[Step], texts: TokenTexts, shown: int | None, offset: int = 0) -> dict:
    """OpenAI's completions logprobs: tokens, token_logprobs (null at prompt position 0), top_logprobs (text ->
    logprob; where another token has the same text, the position's own token's logprob is kept, where vLLM's dict
    keeps the later one's), text_offset (from `offset`: the text already sent).
    `shown`: the dict entries shown per position, vLLM's `logprobs` + 1 (the token and the most likely); None: all
    (logprob_token_ids)."""
    ids = [t for t, _, items in steps for t in (t, *(i for i, _ in items))]
    text = dict(zip(ids, texts(ids), strict=True))
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for token, lp, items in steps:
        tokens.append(text[token])
        token_logprobs.append(None if lp is None else clamp(lp))
        top = None
        if lp is not None:
            top = {text[i]: clamp(v) for i, v in (items if shown is None else items[:shown])}
            top[text[token]] = clamp(lp)  # another token of the same text does not hide the token's own logprob
        tops.append(top)
        offsets.append(offset)
        offset += len(text[token])
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs_json(plp: PromptLogprobs | None, texts: TokenTexts) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs`: per position None at 0, else {token ID (a string, as JSON keys are): {"logprob",
    "rank", "decoded_token"}}: the prompt's token first (its rank: how many tokens are at least as likely), then the
    k most likely with ranks 1..k (the prompt's token keeps its place when it is one of them, with their entry)."""
    if plp is None:
        return None
    entries = plp.entries()
    ids = [t for e in entries if e is not None for t in (e[0], *(i for i, _ in e[3]))]
    decoded = dict(zip(ids, texts(ids), strict=True))
    out: list[dict | None] = []
    for e in entries:
        if e is None:
            out.append(None)
            continue
        token, lp, rank, tops = e
        position = {str(token): {"logprob": clamp(lp), "rank": rank, "decoded_token": decoded[token]}}
        for r, (tid, tlp) in enumerate(tops, 1):
            position[str(tid)] = {"logprob": clamp(tlp), "rank": r, "decoded_token": decoded[tid]}
        out.append(position)
    return out
