"""bad_words are tokenized as vLLM does: the word as it is and after a space (when that makes another first token
of the same length), duplicates once, and refused by index when they make no token or hold a sentinel."""

from __future__ import annotations

import pytest

from preprocessor.bad_words import bad_words_token_ids, with_bad_words
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams


def _vllm(words, tok):
    """vLLM's SamplingParams.update_from_tokenizer, restated."""
    out = []
    for word in dict.fromkeys(words):
        for space in (False, True):
            ids = tok.encode((" " if space else "") + word.lstrip(), add_special_tokens=False)
            if not ids:
                continue
            if not space or (ids[0] != out[-1][0] and len(ids) == len(out[-1])):
                out.append(ids)
    return tuple(tuple(x) for x in out)


@pytest.mark.parametrize("name", ["tiny-text", "tiny-idefics3"])
def test_tokenized_as_vllm_with_and_without_a_leading_space(tiny, name):
    files = tiny[name][0]
    tok = files.tokenizer
    words = ["red", " blue", "green tea", "red", "é"]
    got = bad_words_token_ids(words, tok, files.sentinels)
    assert got == _vllm(words, tok)
    assert tuple(tok.encode("red", add_special_tokens=False)) in got
    assert len(got) > len(set(words))  # some words are banned in both forms


def test_the_preprocessor_writes_the_ids_and_refuses_callers_that_send_them(tiny):
    files = tiny["tiny-text"][0]
    p = with_bad_words(SamplingParams(bad_words=("red",)), files.tokenizer, files.sentinels)
    assert p.bad_words_token_ids == bad_words_token_ids(["red"], files.tokenizer, files.sentinels)
    with pytest.raises(InvalidArgument, match="bad_words_token_ids is written by the preprocessor"):
        with_bad_words(SamplingParams(bad_words_token_ids=((5,),)), files.tokenizer, files.sentinels)


def test_a_sentinel_in_a_bad_word_is_refused_by_index(tiny):
    files = tiny["tiny-text"][0]
    with pytest.raises(InvalidArgument, match=r"bad_words\[1\]: bad word contains the reserved string"):
        bad_words_token_ids(["ok", "x" + files.sentinels.prefix], files.tokenizer, files.sentinels)
