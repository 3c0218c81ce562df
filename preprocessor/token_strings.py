"""The strings logprobs show for tokens, as vLLM renders them (vllm/v1/engine/logprobs.py: convert_ids_list_to_tokens,
_verify_tokens, _correct_decoded_token), for the chosen token and its alternatives alike.

Each token is decoded alone. A byte-level tokenizer splits a multi-byte character over several tokens, and such a
token alone decodes to U+FFFD; vLLM then decodes it after up to 4 tokens of its sequence before it (the chosen
tokens, or the prompt's tokens for prompt logprobs) and keeps what it adds to them: "" while the character is still
incomplete, the whole character on the token that completes it. With return_tokens_as_token_ids every token is
"token_id:N" instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"
CONTEXT = 4  # vLLM's: enough tokens for any UTF-8 sequence

TokenTexts = Callable[[Sequence[int]], list[str]]  # token IDs -> each token's text decoded alone
Decode = Callable[[list[int]], str]  # token IDs -> their text decoded together (special tokens kept)


def as_token_id(token: int) -> str:
    """vLLM's return_tokens_as_token_ids form of a token."""
    return f"token_id:{token}"


class TokenStrings:
    def __init__(self, texts: TokenTexts, decode: Decode, as_ids: bool = False) -> None:
        self.texts = texts
        self._decode = decode
        self.as_ids = as_ids  # return_tokens_as_token_ids

    def alone(self, ids: Sequence[int]) -> list[str]:
        """Each token decoded alone (vLLM's string where a position has no logprobs: a prompt's first token)."""
        return [as_token_id(t) for t in ids] if self.as_ids else self.texts(ids)

    def at(self, ids: Sequence[int], context: Sequence[int]) -> list[str]:
        """The strings of `ids`, alternatives at one position whose sequence so far ends with `context`."""
        if self.as_ids:
            return [as_token_id(t) for t in ids]
        return self.decoded(ids, context)

    def decoded(self, ids: Sequence[int], context: Sequence[int]) -> list[str]:
        """`at` without return_tokens_as_token_ids (vLLM's decoded_token, which chat's `bytes` spell)."""
        return [self.completed(t, context) if s.endswith(REPLACEMENT) else s for t, s in zip(ids, self.texts(ids),
                                                                                              strict=True)]

    def completed(self, token: int, context: Sequence[int]) -> str:
        """What `token` adds to the shortest tail of `context` with which it completes its characters; "" if none
        does."""
        context = list(context[-CONTEXT:])
        for n in range(1, len(context) + 1):
            tail = context[-n:]
            whole = self._decode([*tail, token])
            if whole.endswith(REPLACEMENT):
                continue
            # the tail's own pieces of an unfinished character (each "" when it was shown) belong to this token
            clean = len(tail)
            while clean > 0 and self.texts([tail[clean - 1]])[0].endswith(REPLACEMENT):
                clean -= 1
            prefix = self._decode(tail[:clean]) if clean else ""
            if whole.startswith(prefix):
                return whole[len(prefix):]
            common = 0
            for a, b in zip(prefix, whole, strict=False):
                if a != b:
                    break
                common += 1
            return whole[common:]
        return ""
