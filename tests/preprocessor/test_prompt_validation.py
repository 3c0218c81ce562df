"""Reserved text, engine bounds (vocab rows from ModelInfo, max_model_len), Complete prompts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preprocessor.content import Embeds, Text, TokenIds, Where
from preprocessor.core import PreprocessorCore
from preprocessor.sentinel import SENTINEL_PREFIX, Sentinels
from splice.errors import SpliceError
from splice.model_info import TEXT
from tests.preprocessor.pp_factories import conversation, raw, rows


def _reject(fn, code="INVALID_ARGUMENT") -> str:
    with pytest.raises(SpliceError) as exc:
        fn()
    assert exc.value.code == code, exc.value.message
    return exc.value.message


@pytest.mark.parametrize("name", ["tiny-text", "tiny-llava", "tiny-idefics3", "tiny-gemma3", "tiny-gemma4",
                                  "tiny-qwen3.5", "tiny-lfm2-vl", "tiny-llava-onevision", "tiny-smolvlm",
                                  "tiny-nemotron-omni"])
def test_sentinel_text_rejected(tiny, name):
    core = PreprocessorCore(*tiny[name])
    msg = _reject(lambda: core.normalize_chat(conversation(("user", ["ok", f"sneaky {Sentinels.text(3)}"]))))
    assert "messages[0].content[1]" in msg and SENTINEL_PREFIX in msg and "sentinel" in msg


@pytest.mark.parametrize("name", ["tiny-llava", "tiny-idefics3", "tiny-lfm2-vl", "tiny-llava-onevision",
                                  "tiny-smolvlm", "tiny-nemotron-omni"])
def test_image_placeholder_text_rejected(tiny, name):
    core = PreprocessorCore(*tiny[name])
    msg = _reject(lambda: core.normalize_chat(conversation(("system", "x"), ("user", "look <image> here"))))
    assert "messages[1].content[0]" in msg and "'<image>'" in msg and "image placeholder" in msg


def test_reserved_text_rejected_in_complete_and_tokenize(tiny):
    core = PreprocessorCore(*tiny["tiny-llava"])
    assert "prompt[1]" in _reject(lambda: core.normalize_complete([Text("a", Where(None, 0)),
                                                                   Text("<image>", Where(None, 1))]))
    assert SENTINEL_PREFIX in _reject(lambda: core.tokenize_text(Sentinels.text(0)))
    assert "prompt[0]" in _reject(lambda: core.normalize_complete([Text(Sentinels.text(0), Where(None, 0))]))


def test_ids_validated_against_engine_rows_not_tokenizer(tiny):
    files, info = tiny["tiny-text"]
    conv = conversation(("user", "Hello world"))
    ids = PreprocessorCore(files, info).normalize_chat(conv).request.token_ids
    # An engine whose table is smaller than this tokenizer: the largest ordinary ID must be refused.
    bound = max(ids)
    core = PreprocessorCore(files, replace(info, vocab_rows=bound))
    msg = _reject(lambda: core.normalize_chat(conv))
    assert f"prompt: token ID {bound} (index {ids.index(bound)})" in msg and f"{bound} rows" in msg


def test_prompt_longer_than_max_model_len(tiny):
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, replace(info, max_model_len=10))
    msg = _reject(lambda: core.normalize_chat(conversation(("user", ["hi", rows(20, info.hidden_size)]))))
    assert "max_model_len is 10" in msg


def test_prompt_must_leave_one_position_to_generate(tiny):
    # the same bound as the engine's: a prompt filling the whole context could never get an answer
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, replace(info, max_model_len=10))
    fits = core.normalize_complete([TokenIds(tuple(range(1, 10)), Where(None, 0))]).request
    assert fits.prompt_len == 9
    msg = _reject(lambda: core.normalize_complete([TokenIds(tuple(range(1, 11)), Where(None, 0))]))
    assert "10 positions long" in msg and "left to generate" in msg


def test_embeds_on_an_engine_without_prompt_embeds(tiny):
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, replace(info, input_kinds=(TEXT,)))
    msg = _reject(lambda: core.normalize_chat(conversation(("user", ["x", rows(1, info.hidden_size)]))),
                  code="FAILED_PRECONDITION")
    assert "prompt embeddings" in msg


def test_too_many_embeds_parts(tiny):
    from preprocessor.limits import Limits

    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, info, limits=Limits(max_embeds_parts=1))
    x = rows(1, info.hidden_size)
    assert "at most 1" in _reject(lambda: core.normalize_chat(conversation(("user", [x, x]))))


def test_complete_mixes_ids_text_and_embeds(tiny):
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, info)
    x = rows(3, info.hidden_size)
    text_ids = files.tokenizer("Hello world", add_special_tokens=False)["input_ids"]
    req = core.normalize_complete([TokenIds((1, 2), Where(None, 0)), Embeds("tensor", raw(x), Where(None, 1)),
                                   Text("Hello world", Where(None, 2))]).request
    assert req.token_ids[:2] == [1, 2] and req.token_ids[5:] == text_ids
    assert [(s.offset, s.length) for s in req.embed_spans] == [(2, 3)]


@pytest.mark.parametrize("bad", [-1, "rows", "sentinel"])
def test_complete_out_of_range_ids_rejected(tiny, bad):
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, info)
    t = {"rows": info.vocab_rows, "sentinel": files.sentinels.ids[0]}.get(bad, bad)  # tiny: no headroom
    msg = _reject(lambda: core.normalize_complete([Text("a", Where(None, 0)), TokenIds((5, t), Where(None, 1))]))
    assert f"prompt[1]: token ID {t} (index 1)" in msg and f"{info.vocab_rows} rows" in msg


def test_empty_inputs_rejected(tiny):
    core = PreprocessorCore(*tiny["tiny-text"])
    assert "empty" in _reject(lambda: core.normalize_complete([]))
    assert "empty" in _reject(lambda: conversation())


def test_detokenize_checks_bounds(tiny):
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, info)
    ids = files.tokenizer("Hello world")["input_ids"]
    assert core.detokenize(ids) == files.tokenizer.decode(ids, skip_special_tokens=True)
    assert f"token ID {info.vocab_rows}" in _reject(lambda: core.detokenize([*ids, info.vocab_rows]))


def test_processor_and_engine_image_tokens_must_agree(tiny):
    from tests.preprocessor.pp_factories import png_bytes

    files, info = tiny["tiny-llava"]
    core = PreprocessorCore(files, replace(info, image_token_id=info.image_token_id + 1))
    msg = _reject(lambda: core.normalize_chat(conversation(("user", [png_bytes(), "hi"]))),
                  code="FAILED_PRECONDITION")
    assert "does not match the engine" in msg


def test_many_parts_cannot_add_up_past_the_context(tiny):
    # each part fits alone; together they pass max_model_len, and decoding stops at the part that does it
    files, info = tiny["tiny-text"]
    core = PreprocessorCore(files, replace(info, max_model_len=100))
    parts = ["x"] + [rows(40, info.hidden_size, seed=k) for k in range(5)]
    msg = _reject(lambda: core.normalize_chat(conversation(("user", parts))))
    assert "content[3]" in msg and "120 rows" in msg
    prompt = [Embeds("tensor", raw(rows(40, info.hidden_size, seed=k)), Where(None, k)) for k in range(5)]
    msg = _reject(lambda: core.normalize_complete(prompt))
    assert "prompt[2]" in msg and "120 positions" in msg
