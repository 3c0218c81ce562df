"""Incremental detokenization (no broken characters) and stop strings (hold-back, match dropped)."""

from __future__ import annotations

import pytest

from preprocessor.detokenizer import REPLACEMENT, IncrementalDetokenizer
from preprocessor.stop import StopMatcher

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
