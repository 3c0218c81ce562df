"""Prompt-embeds sentinels: one distinct token per prompt_embeds part in the rendered text.

Part k (in conversation order) renders as sentinel k, so a span belongs to the part whose sentinel it
expands, whatever order the chat template puts the parts in (some templates move the system message
into the last user turn; llava's renders a turn's images before its text).

The sentinels are special tokens of the preprocessor's private tokenizer copy, registered after the
model's own tokens. Their IDs are NOT guaranteed to lie past the engine's embedding table: checkpoints
pad their tables (llava-1.5: 32002 tokens, 32064 rows), so a sentinel ID can also be a valid engine ID.
Hence sentinels only ever appear in rendered chat prompts (never in caller-supplied IDs: Complete builds
its spans without them), detokenization drops their IDs, and after tokenization each sentinel is
expanded to its tensor's row count, ALL spans are located, and only then is every sentinel ID replaced
by an in-vocabulary filler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from preprocessor.content import Where
from splice.errors import InvalidArgument

# Every sentinel starts with this; user text, roles, template kwargs and template overrides may not contain it.
SENTINEL_PREFIX = "<|splice_prompt_embeds"
# The engine overwrites span positions with the supplied rows; the filler only has to be a valid index.
FILLER_ID = 0


def sentinel_text(k: int) -> str:
    """The sentinel of the k-th prompt_embeds part (conversation order)."""
    return f"{SENTINEL_PREFIX}_{k}|>"


def register_sentinels(tokenizer, count: int) -> tuple[int, ...]:
    """Adds sentinel_text(0..count-1) as special tokens of `tokenizer` (a private copy); returns their IDs."""
    texts = [sentinel_text(k) for k in range(count)]
    tokenizer.add_tokens(texts, special_tokens=True)
    ids = tuple(tokenizer.convert_tokens_to_ids(texts))
    for text, sid in zip(texts, ids, strict=True):
        if sid is None or tokenizer.convert_ids_to_tokens(sid) != text:
            raise RuntimeError(f"sentinel {text!r} did not get its own ID")
    if len(set(ids)) != count:
        raise RuntimeError("sentinels did not get distinct IDs")
    return ids


@dataclass(frozen=True)
class Span:
    offset: int  # first position in the expanded IDs
    length: int  # rows of the tensor
    part: int  # index of the prompt_embeds part (conversation order) == index of its tensor


def _describe(where: Where) -> str:
    return f"(message {where.message}, part {where.part})" if where.message is not None else f"({where})"


def expand(ids: Sequence[int], sentinel_ids: Sequence[int], rows: Sequence[int], wheres: Sequence[Where],
           ) -> tuple[list[int], list[Span]]:
    """Replaces the sentinel of part k by rows[k] copies of it; returns the new IDs and the spans in prompt
    order (offset ascending), each naming its part.

    `sentinel_ids` are all registered sentinels (part k renders as sentinel_ids[k]); each of the first
    len(rows) must occur exactly once and no other may occur. Spans come from the expansion itself, not
    from searching the result, so adjacent parts whose sentinel runs touch still get their own spans.
    """
    if len(rows) > len(sentinel_ids):
        raise InvalidArgument(f"the request has {len(rows)} prompt_embeds parts; the preprocessor has "
                              f"{len(sentinel_ids)} sentinels")
    part_of = {sid: k for k, sid in enumerate(sentinel_ids)}
    seen = [0] * len(rows)
    for t in ids:
        k = part_of.get(t)
        if k is None:
            continue
        if k >= len(rows):
            raise InvalidArgument(f"the chat template rendered the prompt_embeds placeholder {sentinel_text(k)!r}, "
                                  f"but the request has only {len(rows)} prompt_embeds parts")
        seen[k] += 1
    for k, n in enumerate(seen):
        if n != 1:
            raise InvalidArgument(f"the chat template rendered prompt_embeds part {_describe(wheres[k])} {n} times; "
                                  f"the template must output every content part exactly once")
    out: list[int] = []
    spans: list[Span] = []
    for t in ids:
        k = part_of.get(t)
        if k is None:
            out.append(t)
        else:
            spans.append(Span(len(out), rows[k], k))
            out.extend([t] * rows[k])
    return out, spans


def consume(ids: Sequence[int], spans: Sequence[Span], sentinel_ids: Sequence[int]) -> list[int]:
    """IDs with every sentinel ID replaced by FILLER_ID; checks that sentinels are exactly the spans, each
    span holding its own part's sentinel."""
    covered = [False] * len(ids)
    for span in spans:
        own = sentinel_ids[span.part]
        for pos in range(span.offset, span.offset + span.length):
            if ids[pos] != own or covered[pos]:
                raise RuntimeError(f"span ({span.offset}, {span.length}) of part {span.part} covers position "
                                   f"{pos}, which is not that part's sentinel or belongs to another span")
            covered[pos] = True
    every = frozenset(sentinel_ids)
    out = list(ids)
    for pos, t in enumerate(out):
        if t in every:
            if not covered[pos]:
                raise RuntimeError(f"sentinel at position {pos} belongs to no span")
            out[pos] = FILLER_ID
    return out
