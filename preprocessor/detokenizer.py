"""Incremental detokenization that never emits half a character.

Byte-level tokenizers split multi-byte UTF-8 characters across tokens; decoding such a prefix yields
U+FFFD. Text is released only once the decoded window no longer ends in U+FFFD. A short window of
earlier tokens is decoded along with the new ones because tokenizers (SentencePiece spaces,
byte-level merges) decode a token differently depending on what precedes it.

IDs in `drop_ids` (the preprocessor's prompt_embeds sentinels, which can be valid engine IDs when the
embedding table is padded) decode to nothing, whatever skip_special_tokens says.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True, drop_ids: Collection[int] = ()) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._drop = frozenset(drop_ids)
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens before this have been released as text

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Text completed by `token_id` ("" while a character is still incomplete)."""
        if token_id in self._drop:
            return ""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix:self._read])
        now = self._decode(self._ids[self._prefix:])
        if len(now) <= len(before) or now.endswith(REPLACEMENT):
            return ""  # nothing new, or a character still waits for its remaining bytes
        self._prefix, self._read = self._read, len(self._ids)
        return now[len(before):]

    def push_many(self, token_ids: Sequence[int]) -> str:
        """Text completed by several tokens at once (a merged engine output): two decodes for the lot instead
        of two per token. Equal to joining `push` of each; an incomplete character at the end of the lot
        falls back to token by token, so the text before it is not held back."""
        kept = [t for t in token_ids if t not in self._drop]
        if len(kept) <= 1:
            return self.push(kept[0]) if kept else ""
        before = self._decode(self._ids[self._prefix:self._read])
        now = self._decode(self._ids[self._prefix:] + kept)
        if now.endswith(REPLACEMENT):
            return "".join([self.push(t) for t in kept])
        self._ids += kept
        if len(now) <= len(before):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return now[len(before):]

    def flush(self) -> str:
        """Whatever is held back when generation ends (an incomplete character decodes as U+FFFD)."""
        before = self._decode(self._ids[self._prefix:self._read])
        now = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return now[len(before):] if now.startswith(before) else now
