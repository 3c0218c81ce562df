"""Incremental detokenization (no broken characters) and stop strings (hold-back, match dropped)."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from preprocessor.detokenizer import REPLACEMENT, IncrementalDetokenizer, decoder, decodes_directly
from preprocessor.stop import StopMatcher
from tests.conftest import SHARED_MODELS

TEXTS = ["héllo wörld, 世界! 🎉🎉 done", "plain ascii text here", "ñ€𝄞 mixed 😀 bytes"]


@pytest.mark.parametrize("name", ["tiny-text", "tiny-idefics3"])
@pytest.mark.parametrize("text", TEXTS)
def test_incremental_equals_full_decode(tiny, name, text):
    tok = tiny[name][0].tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(t) for t in ids] + [detok.flush()]
    assert "".join(deltas) == tok.decode(ids)
    assert not any(REPLACEMENT in d for d in deltas)


def test_split_characters_are_held_back(tiny):
    tok = tiny["tiny-text"][0].tokenizer
    ids = tok("🎉", add_special_tokens=False)["input_ids"]
    # The byte-level tokenizer splits the 4-byte emoji over several tokens (derived, not assumed).
    partial = [i for i in range(1, len(ids)) if tok.decode(ids[:i]).endswith(REPLACEMENT)]
    assert partial, "test needs a character split across tokens"
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(t) for t in ids]
    assert all(d == "" for d in deltas[:-1]) and deltas[-1] == "🎉"


def test_flush_releases_an_unfinished_character(tiny):
    tok = tiny["tiny-text"][0].tokenizer
    ids = tok("a🎉", add_special_tokens=False)["input_ids"][:-1]
    detok = IncrementalDetokenizer(tok)
    streamed = "".join(detok.push(t) for t in ids)
    assert REPLACEMENT not in streamed
    assert streamed + detok.flush() == tok.decode(ids)


def test_skip_special_tokens(tiny):
    tok = tiny["tiny-text"][0].tokenizer
    ids = [*tok("hi", add_special_tokens=False)["input_ids"], tok.eos_token_id]
    keep = IncrementalDetokenizer(tok, skip_special_tokens=False)
    skip = IncrementalDetokenizer(tok, skip_special_tokens=True)
    assert "".join(keep.push(t) for t in ids) + keep.flush() == "hi" + tok.eos_token
    assert "".join(skip.push(t) for t in ids) + skip.flush() == "hi"


def _run(stops, pieces):
    m = StopMatcher(stops)
    out = [m.push(p) for p in pieces]
    return out, m.flush(), m.matched


def test_stop_string_split_across_pieces():
    out, tail, matched = _run(["STOP"], ["Hello S", "T", "OP and more"])
    assert "".join(out) == "Hello " and tail == "" and matched == "STOP"
    assert out[0] == "Hello "  # the partial "S" was held back, never emitted


def test_partial_match_released_when_it_fails():
    out, tail, matched = _run(["STOP"], ["a ST", "AR b"])
    assert out == ["a ", "STAR b"] and matched is None and tail == ""


def test_held_text_released_at_the_end():
    out, tail, matched = _run(["STOP"], ["abc ST"])
    assert out == ["abc "] and tail == "ST" and matched is None


def test_earliest_of_several_stops_wins():
    out, _, matched = _run(["world", "lo"], ["hello world"])
    assert out == ["hel"] and matched == "lo"


def test_nothing_after_a_match():
    m = StopMatcher(["x"])
    assert m.push("axb") == "a" and m.push("more") == "" and m.flush() == ""


def test_no_stops_passes_through():
    assert _run([], ["a", "b"])[0] == ["a", "b"]


def test_include_stop_str_in_output_ends_the_text_with_the_match():
    m = StopMatcher(["STOP"], include=True)
    assert m.push("Hello S") == "Hello " and m.push("TOP and more") == "STOP" and m.matched == "STOP"
    assert m.push("later") == "" and m.flush() == ""


def test_text_that_is_not_searchable_holds_no_whole_match_but_can_begin_one():
    m = StopMatcher(["STOP"])  # the first pushes are min_tokens' text, as vLLM's detokenizer skips it
    assert m.push("a STOP b", searchable=False) == "a STOP b" and m.matched is None
    assert m.push("ST", searchable=False) == "" and m.push("OP!") == "" and m.matched == "STOP"
    m = StopMatcher(["STOP"])
    assert m.push("xSTOP", searchable=False) == "xSTOP" and m.push("y") == "y" and m.matched is None


def _tokenizers(tiny, shared_dir):
    out = {name: files.tokenizer for name, (files, _) in tiny.items()}
    if shared_dir.is_dir():
        for path in sorted(shared_dir.iterdir()):
            try:
                out[path.name] = AutoTokenizer.from_pretrained(path)
            except Exception:  # a folder without a tokenizer (its README says what loads)
                continue
    return out


def test_the_direct_decoder_equals_hfs_decode(tiny):
    """The detokenizer skips HF's decode wrapper where it only calls the Rust tokenizer; the text must be the
    same for every tokenizer Splice ships or is tested against, special tokens and sentinels included."""
    tokenizers = _tokenizers(tiny, SHARED_MODELS)
    assert decodes_directly(tiny["tiny-text"][0].tokenizer)  # the path under test is taken
    rng = random.Random(0)
    for name, tok in tokenizers.items():
        special = list(tok.all_special_ids) + list(tok.added_tokens_decoder)
        texts = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
        samples = texts + [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
        samples += [[*s[:3], rng.choice(special), *s[3:]] for s in samples[:10] if special]
        for skip in (True, False):
            fast = decoder(tok, skip)
            for ids in samples:
                assert fast(ids) == tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False), \
                    (name, skip, ids)
