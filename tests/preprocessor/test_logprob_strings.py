"""How logprobs spell tokens, as vLLM 0.32 does on the same tokens (seen side by side by bench/vs_vllm_api.py): a
byte-level token holding part of a character is "" (bytes []) until the token that completes the character, which
is the whole character; its alternatives at the same place likewise; a prompt's first token is decoded alone. With
return_tokens_as_token_ids every token is "token_id:N" (chat's `bytes` of the chosen token still spell its text).

The tiny models' tokenizer is byte-level: "À" is two tokens, neither text alone.
"""

from __future__ import annotations

import json

import pytest

from preprocessor.answer import Collected, whole_answer
from preprocessor.core import PreprocessorCore
from preprocessor.http.logprobs import prompt_logprobs_json
from preprocessor.http.responses import ChatShape, Shape
from preprocessor.outputs import GenerationChunk
from preprocessor.token_strings import TokenStrings
from splice.engine_output import FinishReason, Usage
from splice.prompt_logprobs import PromptLogprobs


@pytest.fixture
def core(tiny):
    files, info = tiny["tiny-text"]
    return PreprocessorCore(files, info)


def _answer(core, text: str = "À la") -> GenerationChunk:
    """`text`'s tokens as a whole answer, each with -0.5 and two alternatives: itself and the first token of "À"."""
    ids = tuple(core.files.tokenizer(text, add_special_tokens=False)["input_ids"])
    first = ids[0]
    return GenerationChunk(text, ids, (-0.5,) * len(ids), FinishReason.LENGTH, Usage(3, len(ids)),
                           top_ids=tuple(t for i in ids for t in (i, first)), top_logprobs=(-0.5, -1.5) * len(ids))


def _whole(shape, answer: GenerationChunk) -> dict:
    collected = Collected()
    collected.add(answer)
    return shape.response(whole_answer([collected]))["choices"][0]["logprobs"]


def test_pieces_of_a_character_are_empty_then_the_character(core):
    answer = _answer(core)
    assert [core.token_texts([t])[0] for t in answer.token_ids[:2]] == ["\ufffd", "\ufffd"]  # alone: replacement
    strings = TokenStrings(core.token_texts, core.decode_ids)
    content = _whole(ChatShape("r", "m", strings, logprobs=True), answer)["content"]
    assert [c["token"] for c in content] == ["", "À", " ", "l", "a"]
    assert content[0]["bytes"] == [] and content[1]["bytes"] == list("À".encode())
    # the alternatives at a place are spelled at that place of the sequence: "À"'s first byte after " " is ""
    assert [a["token"] for a in content[0]["top_logprobs"]] == [""]  # (itself: one entry per token, vLLM's dict)
    assert [a["token"] for a in content[2]["top_logprobs"]] == [" ", ""]
    completion = _whole(Shape("r", "m", strings, logprobs=True, shown=2), answer)
    assert completion["tokens"] == ["", "À", " ", "l", "a"] and completion["text_offset"] == [0, 0, 1, 2, 3]


def test_a_stream_keeps_the_sequence_across_chunks(core):
    answer = _answer(core)
    strings = TokenStrings(core.token_texts, core.decode_ids)
    for shape in (ChatShape("r", "m", strings, logprobs=True), Shape("r", "m", strings, logprobs=True)):
        tokens = []
        for i, t in enumerate(answer.token_ids):
            piece = GenerationChunk("", (t,), (-0.5,), top_ids=(t, answer.token_ids[0]), top_logprobs=(-0.5, -1.5))
            lp = shape.chunk(piece)["choices"][0]["logprobs"]
            tokens += [c["token"] for c in lp["content"]] if "content" in lp else lp["tokens"]
            if "text_offset" in lp:
                assert lp["text_offset"] == [[0, 0, 1, 2, 3][i]]
        assert tokens == ["", "À", " ", "l", "a"]


def test_return_tokens_as_token_ids(core):
    answer = _answer(core)
    strings = TokenStrings(core.token_texts, core.decode_ids, as_ids=True)
    content = _whole(ChatShape("r", "m", strings, logprobs=True), answer)["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in answer.token_ids]
    assert content[0]["bytes"] == [] and content[1]["bytes"] == list("À".encode())  # the chosen one's text, vLLM's
    assert content[1]["top_logprobs"][1] == {"token": f"token_id:{answer.token_ids[0]}", "logprob": -1.5,
                                             "bytes": list(f"token_id:{answer.token_ids[0]}".encode())}
    completion = _whole(Shape("r", "m", strings, logprobs=True, shown=2), answer)
    assert completion["tokens"] == [f"token_id:{t}" for t in answer.token_ids]
    lengths = [len(t) for t in completion["tokens"]]
    assert completion["text_offset"] == [sum(lengths[:i]) for i in range(len(lengths))]  # by the strings shown


def test_prompt_logprobs_spell_the_prompt_in_its_sequence(core):
    """vLLM's: position 0 has no entry and is no context, so a character split over positions 0 and 1 gives "" at 1;
    one split over 1 and 2 gives "" then the character."""
    tok = core.files.tokenizer
    ids = (*tok("a", add_special_tokens=False)["input_ids"], *tok("À", add_special_tokens=False)["input_ids"])
    plp = PromptLogprobs(ids, (-1.0,) * (len(ids) - 1), (1,) * (len(ids) - 1), (), ())
    strings = TokenStrings(core.token_texts, core.decode_ids, as_ids=True)  # (decoded_token is text even so)
    got = json.loads(prompt_logprobs_json(plp, strings).text())
    assert [got[i][str(ids[i])]["decoded_token"] for i in (1, 2)] == ["", "À"]
    split = tuple(core.files.tokenizer("À", add_special_tokens=False)["input_ids"])
    got = json.loads(prompt_logprobs_json(PromptLogprobs(split, (-1.0,), (1,), (), ()), strings).text())
    assert got[1][str(split[1])]["decoded_token"] == ""
