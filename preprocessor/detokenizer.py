"""Incremental detokenization that never emits half a character.

Byte-level tokenizers split multi-byte UTF-8 characters across tokens; decoding such a prefix yields
U+FFFD. Text is released only once the decoded window no longer ends in U+FFFD. A short window of
earlier tokens is decoded along with the new ones because tokenizers (SentencePiece spaces,
byte-level merges) decode a token differently depending on what precedes it.

IDs in `drop_ids` (the preprocessor's prompt_embeds sentinels, which can be valid engine IDs when the
embedding table is padded) decode to nothing, whatever skip_special_tokens says.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

try:
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
except ImportError:  # a transformers without it: always through decode()
    TokenizersBackend = None

REPLACEMENT = "\ufffd"


def decodes_directly(tokenizer) -> bool:
    """HF's decode of a flat ID list is only its Rust tokenizer's decode: a fast tokenizer whose class overrides
    neither `decode` nor `_decode` (and no clean-up, which the detokenizer never asks for)."""
    cls = type(tokenizer)
    return (TokenizersBackend is not None and isinstance(tokenizer, TokenizersBackend)
            and getattr(tokenizer, "_tokenizer", None) is not None
            and cls.decode is PreTrainedTokenizerBase.decode and cls._decode is TokenizersBackend._decode)


def decoder(tokenizer, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """`ids -> tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)`.

    Straight to the Rust tokenizer where that is all HF's decode does (`decodes_directly`): HF's wrapper converts
    and type-checks the IDs again on every call, which was a tenth of the preprocessor's time per streamed token.
    Any other tokenizer goes through its own decode."""
    if decodes_directly(tokenizer):
        rust = tokenizer._tokenizer
        return lambda ids: rust.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                        clean_up_tokenization_spaces=False)


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True, drop_ids: Collection[int] = ()) -> None:
        self._decode = decoder(tokenizer, skip_special_tokens)
        self._drop = frozenset(drop_ids)
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens before this have been released as text

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
