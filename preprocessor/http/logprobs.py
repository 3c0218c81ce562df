"""Logprobs in vLLM's JSON: a prompt's `prompt_logprobs` list, and the completions `logprobs` object of generated
tokens (echoed prompt tokens first, with `echo`), built as vLLM 0.33 builds them (serving_completion's
_create_completion_logprobs, logprobs.append_logprobs_for_next_position) so the same request reads the same.

vLLM keeps each position's logprobs as a dict keyed by token ID, the position's own token (prompt token or chosen
one) first, then its alternatives (the most likely, or the logprob_token_ids); an ID already in it keeps its place.
A Step is that dict as items, in that order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

from preprocessor.http.json_body import RawJSON
from preprocessor.token_strings import CONTEXT, REPLACEMENT, TokenStrings
from splice.prompt_logprobs import PromptLogprobs

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


def step_strings(steps: Sequence[Step], strings: TokenStrings, context: Sequence[int] = ()) -> list[dict[int, str]]:
    """Each step's token strings by ID (its token's and its alternatives'), as vLLM renders them at that place of
    their sequence (token_strings.py): `context` holds the sequence's tokens before the first step, and each
    step's own token follows it. A step without a logprob (a prompt's first position) is decoded alone and is no
    context, as vLLM keeps no entry for it."""
    ctx = list(context[-CONTEXT:])
    out = []
    for token, lp, items in steps:
        if lp is None:
            out.append(dict(zip([token], strings.alone([token]), strict=True)))
            continue
        ids = list(dict.fromkeys([token, *(i for i, _ in items)]))
        out.append(dict(zip(ids, strings.at(ids, ctx), strict=True)))
        ctx = [*ctx[1 - CONTEXT:], token]
    return out


def completion_logprobs(steps: Sequence[Step], strings: Sequence[dict[int, str]], shown: int | None,
                        offset: int = 0) -> dict:
    """OpenAI's completions logprobs: tokens, token_logprobs (null at prompt position 0), top_logprobs (text ->
    logprob; where another token has the same text, the position's own token's logprob is kept, where vLLM's dict
    keeps the later one's), text_offset (from `offset`: the text already sent, advancing by each token's string).
    `strings`: step_strings of `steps`. `shown`: the dict entries shown per position, vLLM's `logprobs` + 1 (the
    token and the most likely); None: all (logprob_token_ids)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for (token, lp, items), text in zip(steps, strings, strict=True):
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


def prompt_logprobs_json(plp: PromptLogprobs | None, strings: TokenStrings) -> RawJSON | None:
    """vLLM's `prompt_logprobs`, written as JSON: per position null at 0, else {token ID (a string, as JSON keys are):
    {"logprob", "rank", "decoded_token"}}: the prompt's token first (its rank: how many tokens are at least as
    likely), then the k most likely with ranks 1..k (the prompt's token keeps its place when it is one of them, with
    their entry). decoded_token is vLLM's decoded text, with return_tokens_as_token_ids too.

    Written as text, a position at a time, rather than built as dicts for json.dumps: a prompt of 1,500 positions with
    k = 20 is 31,500 entries, and the dicts and their encoding cost the preprocessor ~130 ms of CPU per request (in
    which other clients' requests waited for the interpreter); the bytes are json.dumps's (the tests parse them)."""
    if plp is None:
        return None
    ids, k = plp.token_ids, plp.k
    logprobs, top_logprobs = _numbers(plp.logprobs), _numbers(plp.top_logprobs)
    ranks = [f',"rank":{r},"decoded_token":' for r in range(k + 1)]  # an alternative's rank is its place, 1..k
    known = list(set(ids) | set(plp.top_ids))
    heads = {t: f'"{t}":{{"logprob":' for t in known}  # token ID -> its entries' start
    # token ID -> its decoded_token as JSON; None where it depends on the tokens before it
    alone = {t: None if s.endswith(REPLACEMENT) else _string(s) for t, s in zip(known, strings.texts(known),
                                                                                   strict=True)}
    context: list[int] = []  # (position 0 is no context: vLLM keeps no entry for it)
    pieces = ["[null" if ids else "["]
    for i, (token, rank) in enumerate(zip(ids[1:], plp.ranks, strict=True)):
        text = alone[token] or _string(strings.completed(token, context))
        position = {token: f'{heads[token]}{logprobs[i]},"rank":{rank},"decoded_token":{text}}}'}
        for r, j in enumerate(range(i * k, (i + 1) * k), 1):
            tid = plp.top_ids[j]
            text = alone[tid] or _string(strings.completed(tid, context))
            position[tid] = heads[tid] + top_logprobs[j] + ranks[r] + text + "}"
        pieces.append(",{" + ",".join(position.values()) + "}")
        context = [*context[1 - CONTEXT:], token]
    pieces.append("]")
    return RawJSON(tuple(pieces))


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _numbers(logprobs: Sequence[float]) -> list[str]:
    """Logprobs clamped and written as json.dumps writes them (float's repr); NaN refused, as by json.dumps."""
    clamped = [max(v, MIN_LOGPROB) for v in logprobs]
    if not all(map(math.isfinite, clamped)):
        raise ValueError("Out of range float values are not JSON compliant")
    return list(map(float.__repr__, clamped))
