"""Merged engine outputs (a reader that fell behind gets several steps' tokens in one message): the text, IDs,
stop handling and usage are exactly those of the one-token-per-output stream."""

from __future__ import annotations

import pytest

from preprocessor.core import PreprocessorCore
from preprocessor.detokenizer import IncrementalDetokenizer
from splice.engine_output import FinishReason
from splice.sampling import SamplingParams
from tests.preprocessor.pp_factories import chat_chunks, conversation
from tests.preprocessor.test_generation_stream import ScriptedEngine

TEXT = "Le café 世界 🙂 naïve\n\n  spaced  out — ünïcödé, then plain words and 12345 digits."


def _pieces(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i:i + size] for i in range(0, len(ids), size)]


@pytest.mark.parametrize("model", ["tiny-text", "tiny-idefics3", "tiny-llava"])
@pytest.mark.parametrize("size", [2, 3, 7, 1000])
def test_push_many_releases_the_same_text_as_token_by_token(tiny, model, size):
    tokenizer = tiny[model][0].tokenizer
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    one = IncrementalDetokenizer(tokenizer)
    by_one = [one.push(t) for t in ids] + [one.flush()]
    many = IncrementalDetokenizer(tokenizer)
    by_many = [many.push_many(p) for p in _pieces(ids, size)] + [many.flush()]
    assert "".join(by_many) == "".join(by_one) == tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    assert all("\ufffd" not in piece for piece in by_many[:-1])  # never half a character


def test_push_many_skips_dropped_ids(tiny):
    tokenizer = tiny["tiny-text"][0].tokenizer
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    drop = ids[3]
    plain = IncrementalDetokenizer(tokenizer)
    expected = "".join(plain.push(t) for t in ids if t != drop) + plain.flush()
    detok = IncrementalDetokenizer(tokenizer, drop_ids={drop})
    assert "".join(detok.push_many(p) for p in _pieces(ids, 4)) + detok.flush() == expected


async def _stream(tiny, ids: list[int], per_output: int, **sampling):
    files, info = tiny["tiny-text"]
    engine = ScriptedEngine(ids, per_output=per_output)
    core = PreprocessorCore(files, info, engine)
    chunks = await chat_chunks(core, conversation(("user", "Hi")), SamplingParams(**sampling))
    return chunks, engine


@pytest.mark.parametrize("per_output", [4, 9, 10_000])
async def test_merged_outputs_stream_the_same_text_ids_and_usage(tiny, per_output):
    ids = tiny["tiny-text"][0].tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    single, _ = await _stream(tiny, ids, 1)
    merged, _ = await _stream(tiny, ids, per_output)
    assert len(merged) == -(-len(ids) // per_output)  # one chunk per engine output: text deltas merged
    assert "".join(c.text for c in merged) == "".join(c.text for c in single) == TEXT
    assert [t for c in merged for t in c.token_ids] == ids
    assert merged[-1].finish_reason is FinishReason.LENGTH and merged[-1].usage == single[-1].usage


@pytest.mark.parametrize("stop", ["naïve", "12345", "— ü", "words and"])
@pytest.mark.parametrize("per_output", [3, 10_000])
async def test_a_stop_string_inside_a_merged_output_ends_at_the_same_token(tiny, stop, per_output):
    ids = tiny["tiny-text"][0].tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    single, _ = await _stream(tiny, ids, 1, stop=(stop,))
    merged, _ = await _stream(tiny, ids, per_output, stop=(stop,))
    assert "".join(c.text for c in merged) == "".join(c.text for c in single) == TEXT[:TEXT.index(stop)]
    assert [t for c in merged for t in c.token_ids] == [t for c in single for t in c.token_ids]
    final = merged[-1]
    assert final.finish_reason is FinishReason.STOP and final.stop_reason == stop
    assert final.usage == single[-1].usage and final.usage.completion_tokens == sum(len(c.token_ids) for c in merged)
