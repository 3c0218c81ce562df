"""Prompt-embeds sentinels: one distinct token per prompt_embeds part in the rendered text.

Part k (in conversation order) renders as sentinel k, so a span belongs to the part whose sentinel it
expands, whatever order the chat template puts the parts in (some templates move the system message
into the last user turn; llava's renders a turn's images before its text).

The sentinels are special tokens of the preprocessor's private tokenizer copy, registered after the
model's own tokens. Their IDs are NOT guaranteed to lie past the engine's embedding table: checkpoints
pad their tables (llava-1.5: 32002 tokens, 32064 rows), so a sentinel ID can also be a valid engine ID.
Hence sentinels only ever appear in rendered chat prompts (never in caller-supplied IDs: Complete builds
its spans without them, and caller text may not contain them), detokenization drops their IDs, and after
tokenization each sentinel is expanded to its tensor's row count, ALL spans are located, and only then is
every sentinel ID replaced by an in-vocabulary filler: `Sentinels.splice` does both in one call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, NamedTuple

from preprocessor.content import Where
from splice.errors import InvalidArgument

# Every sentinel starts with this; user text, roles, template kwargs and template overrides may not contain it.
SENTINEL_PREFIX = "<|splice_prompt_embeds"
# The engine overwrites span positions with the supplied rows; the filler only has to be a valid index.
FILLER_ID = 0
# Sentinels the model files register: the ceiling of Limits.max_embeds_parts (one sentinel per part).
MAX_EMBEDS_PARTS = 256


@dataclass(frozen=True)
class Span:
    offset: int  # first position in the expanded IDs
    length: int  # rows of the tensor
    part: int  # index of the prompt_embeds part (conversation order) == index of its tensor


class Spliced(NamedTuple):
    ids: list[int]  # sentinels expanded, then replaced by FILLER_ID: what the engine gets
    spans: list[Span]  # in prompt order (offset ascending), each naming its part
    expanded: list[int]  # the same positions before the sentinels were replaced (for inspection)


def _describe(where: Where) -> str:
    return f"(message {where.message}, part {where.part})" if where.message is not None else f"({where})"


@dataclass(frozen=True)
class Sentinels:
    """The sentinels registered on one tokenizer: ids[k] is the ID of text(k)."""

    ids: tuple[int, ...]
    prefix: ClassVar[str] = SENTINEL_PREFIX

    @staticmethod
    def text(k: int) -> str:
        """The sentinel of the k-th prompt_embeds part (conversation order)."""
        return f"{SENTINEL_PREFIX}_{k}|>"

    @classmethod
    def register(cls, tokenizer, count: int = MAX_EMBEDS_PARTS) -> Sentinels:
        """Adds text(0..count-1) as special tokens of `tokenizer` (a private copy)."""
        if not 1 <= count <= MAX_EMBEDS_PARTS:
            raise ValueError(f"the sentinel count must be in [1, {MAX_EMBEDS_PARTS}], got {count}")
        texts = [cls.text(k) for k in range(count)]
        tokenizer.add_tokens(texts, special_tokens=True)
        ids = tuple(tokenizer.convert_tokens_to_ids(texts))
        for text, sid in zip(texts, ids, strict=True):
            if sid is None or tokenizer.convert_ids_to_tokens(sid) != text:
                raise RuntimeError(f"sentinel {text!r} did not get its own ID")
        if len(set(ids)) != count:
            raise RuntimeError("sentinels did not get distinct IDs")
        return cls(ids)

    @property
    def count(self) -> int:
        """Most prompt_embeds parts one request can have."""
        return len(self.ids)

    @cached_property
    def id_set(self) -> frozenset[int]:
        return frozenset(self.ids)

    @cached_property
    def part_of(self) -> dict[int, int]:
        """Sentinel ID -> the prompt_embeds part it stands for (built once: every request looks them up)."""
        return {sid: k for k, sid in enumerate(self.ids)}

    def check_text(self, text: str, where: object, what: str = "text") -> None:
        """Caller text may not contain a sentinel: it would be read as a prompt_embeds part. `where` ("" for
        none) and `what` name the text in the message."""
        if self.prefix in text:
            at = f"{where}: " if where else ""
            raise InvalidArgument(f"{at}{what} contains the reserved string {self.prefix!r} (the prefix of the "
                                  f"prompt_embeds sentinels); send embeddings as their own content parts")

    def drop(self, ids: Iterable[int]) -> list[int]:
        """`ids` without sentinel IDs: generated or caller IDs never decode to a sentinel's text."""
        return [t for t in ids if t not in self.id_set]

    def splice(self, ids: Sequence[int], rows: Sequence[int], wheres: Sequence[Where]) -> Spliced:
        """Expands the sentinel of part k to rows[k] copies, locates every span, and only then replaces every
        sentinel ID by FILLER_ID. One call, because consuming before all spans are known would lose them.

        Each of the first len(rows) sentinels must occur exactly once in `ids` and no other may occur
        (wheres[k] names part k). Spans come from the expansion itself, not from searching the result, so
        adjacent parts whose sentinel runs touch still get their own spans.
        """
        expanded, spans = self._expand(ids, rows, wheres)
        return Spliced(self._consume(expanded, spans), spans, expanded)

    def _expand(self, ids: Sequence[int], rows: Sequence[int], wheres: Sequence[Where],
                ) -> tuple[list[int], list[Span]]:
        if len(rows) > self.count:
            raise InvalidArgument(f"the request has {len(rows)} prompt_embeds parts; the preprocessor has "
                                  f"{self.count} sentinels")
        part_of = self.part_of
        seen = [0] * len(rows)
        for t in ids:
            k = part_of.get(t)
            if k is None:
                continue
            if k >= len(rows):
                raise InvalidArgument(f"the chat template rendered the prompt_embeds placeholder {self.text(k)!r}, "
                                      f"but the request has only {len(rows)} prompt_embeds parts")
            seen[k] += 1
        for k, n in enumerate(seen):
            if n != 1:
                raise InvalidArgument(f"the chat template rendered prompt_embeds part {_describe(wheres[k])} {n} "
                                      f"times; the template must output every content part exactly once")
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

    def _consume(self, ids: Sequence[int], spans: Sequence[Span]) -> list[int]:
        """IDs with every sentinel ID replaced by FILLER_ID; checks that sentinels are exactly the spans, each
        span holding its own part's sentinel."""
        covered = [False] * len(ids)
        for span in spans:
            own = self.ids[span.part]
            for pos in range(span.offset, span.offset + span.length):
                if ids[pos] != own or covered[pos]:
                    raise RuntimeError(f"span ({span.offset}, {span.length}) of part {span.part} covers position "
                                       f"{pos}, which is not that part's sentinel or belongs to another span")
                covered[pos] = True
        out = list(ids)
        for pos, t in enumerate(out):
            if t in self.id_set:
                if not covered[pos]:
                    raise RuntimeError(f"sentinel at position {pos} belongs to no span")
                out[pos] = FILLER_ID
        return out
