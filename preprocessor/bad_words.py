"""bad_words -> the token sequences the engine bans, tokenized as vLLM does (SamplingParams.update_from_tokenizer):
each word with its leading spaces stripped, once as it is and once after one space, so that it is banned at the
start of the text and in the middle of it; the spaced form only when it makes a different first token and as many
tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from preprocessor.sentinel import Sentinels
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams


def bad_words_token_ids(words: Sequence[str], tokenizer, sentinels: Sentinels) -> tuple[tuple[int, ...], ...]:
    out: list[list[int]] = []
    seen: set[str] = set()
    for i, word in enumerate(words):
        if word in seen:
            continue
        seen.add(word)
        sentinels.check_text(word, f"bad_words[{i}]", "bad word")
        for prefix in ("", " "):
            ids = tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False)
            if not ids:
                if not prefix:
                    raise InvalidArgument(f"bad_words[{i}] ({word!r}) makes no token")
                continue
            if not prefix or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
    return tuple(tuple(ids) for ids in out)


def with_bad_words(sampling: SamplingParams, tokenizer, sentinels: Sentinels) -> SamplingParams:
    """`sampling` with bad_words_token_ids written from its bad_words."""
    if sampling.bad_words_token_ids:
        raise InvalidArgument("sampling.bad_words_token_ids is written by the preprocessor from bad_words; leave it "
                              "empty and send the words")
    if not sampling.bad_words:
        return sampling
    return dataclasses.replace(sampling, bad_words_token_ids=bad_words_token_ids(sampling.bad_words, tokenizer,
                                                                                 sentinels))
