"""The prompt-embeds sentinel: one token per prompt_embeds part in the rendered text.

Its ID lies past the model's vocabulary (the tokenizer copy is private to the preprocessor), so it
must never reach the engine: after tokenization each sentinel is expanded to its tensor's row count,
ALL spans are located, and only then is every sentinel ID replaced by an in-vocabulary filler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from splice.errors import InvalidArgument

SENTINEL = "<|splice_prompt_embeds|>"
# The engine overwrites span positions with the supplied rows; the filler only has to be a valid index.
FILLER_ID = 0


def register_sentinel(tokenizer) -> int:
    """Adds SENTINEL as a special token of `tokenizer` (a private copy) and returns its ID."""
    before = len(tokenizer)
    tokenizer.add_tokens([SENTINEL], special_tokens=True)
    sentinel_id = tokenizer.convert_tokens_to_ids(SENTINEL)
    if sentinel_id < before and tokenizer.convert_ids_to_tokens(sentinel_id) != SENTINEL:
        raise RuntimeError(f"sentinel {SENTINEL!r} did not get its own ID")
    return sentinel_id


@dataclass(frozen=True)
class Span:
    offset: int  # first position in the expanded IDs
    length: int  # rows of the tensor


def expand(ids: Sequence[int], sentinel_id: int, rows: Sequence[int]) -> tuple[list[int], list[Span]]:
    """Replaces the k-th sentinel by rows[k] copies of it; returns the new IDs and the k-th span.

    Spans come from the expansion itself, not from searching the result, so adjacent parts whose
    sentinel runs touch still get their own spans.
    """
    found = sum(1 for t in ids if t == sentinel_id)
    if found != len(rows):
        raise InvalidArgument(f"the chat template rendered {found} prompt_embeds placeholders for {len(rows)} "
                              f"prompt_embeds parts; the template must output every content part exactly once")
    out: list[int] = []
    spans: list[Span] = []
    for t in ids:
        if t == sentinel_id:
            n = rows[len(spans)]
            spans.append(Span(len(out), n))
            out.extend([sentinel_id] * n)
        else:
            out.append(t)
    return out, spans


def consume(ids: Sequence[int], spans: Sequence[Span], sentinel_id: int) -> list[int]:
    """IDs with every sentinel replaced by FILLER_ID; checks that sentinels are exactly the spans."""
    covered = [False] * len(ids)
    for span in spans:
        for pos in range(span.offset, span.offset + span.length):
            if ids[pos] != sentinel_id:
                raise RuntimeError(f"span ({span.offset}, {span.length}) covers non-sentinel position {pos}")
            covered[pos] = True
    out = list(ids)
    for pos, t in enumerate(out):
        if t == sentinel_id:
            if not covered[pos]:
                raise RuntimeError(f"sentinel at position {pos} belongs to no span")
            out[pos] = FILLER_ID
    return out
