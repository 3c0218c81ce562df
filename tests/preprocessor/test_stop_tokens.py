"""A choice the engine ends on a token ends as vLLM's: the token stays in its IDs, its text is left out unless
include_stop_str_in_output (the EOS's too), and stop_reason names it unless it is the tokenizer's EOS (checked first,
as vLLM's check_stop does). On both faces: GenerationChunk.stop_token_id over gRPC, `stop_reason` in the JSON.

The engine here replays token IDs and ends on the last one with finish_reason stop, as the engine does when it
samples an EOS or a stop token (the engine's side: tests/engine).
"""

from __future__ import annotations

import dataclasses

import pytest

from clients.types import Chunk
from preprocessor.answer import Collected, whole_answer
from preprocessor.core import PreprocessorCore
from preprocessor.encode import chunk_pb
from preprocessor.http.responses import ChatShape, Shape
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.sampling import SamplingParams
from tests.preprocessor.pp_factories import chat_chunks, conversation


class StopEngine:
    """Replays `ids`, `per_output` at a time; the last output ends the choice with finish_reason stop."""

    def __init__(self, ids: list[int], per_output: int = 1) -> None:
        self.ids, self.per_output = ids, per_output

    async def generate(self, request):
        for start in range(0, len(self.ids), self.per_output):
            batch = tuple(self.ids[start:start + self.per_output])
            last = start + self.per_output >= len(self.ids)
            yield EngineOutput(batch, finish_reason=FinishReason.STOP if last else None,
                               usage=Usage(request.prompt_len, len(self.ids)) if last else None)


def _setup(tiny):
    files, info = tiny["tiny-text"]
    tok = files.tokenizer
    words = tok("1, 2, 3", add_special_tokens=False)["input_ids"]
    comma = tok(",", add_special_tokens=False)["input_ids"][0]
    upto = words[:words.index(comma) + 1]  # "1,": the answer ends on the comma
    return files, info, tok, upto, comma


async def _answer(core, sampling):
    chunks = await chat_chunks(core, conversation(("user", "Count")), sampling)
    return chunks, "".join(c.text for c in chunks), chunks[-1]


@pytest.mark.parametrize("per_output", [1, 3])
async def test_a_stop_token_is_named_and_its_text_left_out(tiny, per_output):
    files, info, tok, upto, comma = _setup(tiny)
    core = PreprocessorCore(files, info, StopEngine(upto, per_output))
    for stop in ((), ("never",)):  # (with a stop string, the tokens are pushed one by one)
        chunks, text, last = await _answer(core, SamplingParams(stop_token_ids=(comma,), stop=stop))
        assert text == tok.decode(upto[:-1]) and not text.endswith(",")
        assert [t for c in chunks for t in c.token_ids] == upto  # the token itself is in the IDs
        assert last.finish_reason is FinishReason.STOP and last.stop_token_id == comma and last.stop_reason == ""
        assert last.stop_reason_json == comma and last.usage.completion_tokens == len(upto)
    _, text, last = await _answer(core, SamplingParams(stop_token_ids=(comma,), include_stop_str_in_output=True))
    assert text == tok.decode(upto) and last.stop_token_id == comma


async def test_the_tokenizers_eos_is_no_stop_reason_and_is_no_text(tiny):
    files, info, tok, upto, _comma = _setup(tiny)
    eos = tok.eos_token_id
    core = PreprocessorCore(files, info, StopEngine([*upto[:-1], eos]))
    for sampling in (SamplingParams(skip_special_tokens=False),  # its text would show: it does not, as vLLM's
                     SamplingParams(skip_special_tokens=False, stop_token_ids=(eos,))):  # EOS is checked first
        _, text, last = await _answer(core, sampling)
        assert text == tok.decode(upto[:-1]) and last.stop_token_id is None and last.stop_reason_json is None
    _, text, last = await _answer(core, SamplingParams(skip_special_tokens=False, include_stop_str_in_output=True))
    assert text == tok.decode([*upto[:-1], eos]) and last.stop_token_id is None
    # with ignore_eos, the EOS ends an answer only as a stop token: then it is named
    _, _, last = await _answer(core, SamplingParams(ignore_eos=True, stop_token_ids=(eos,)))
    assert last.stop_token_id == eos


async def test_another_eos_of_the_generation_config_is_named(tiny):
    """vLLM adds the generation config's EOS tokens besides the tokenizer's to stop_token_ids."""
    files, info, tok, upto, _comma = _setup(tiny)
    other = next(t for t in (2, 1, 0) if t != tok.eos_token_id)
    info = dataclasses.replace(info, eos_token_ids=(tok.eos_token_id, other))
    core = PreprocessorCore(files, info, StopEngine([*upto[:-1], other]))
    _, text, last = await _answer(core, SamplingParams())
    assert last.stop_token_id == other and text == tok.decode(upto[:-1])


async def test_a_stop_string_is_named_before_the_token(tiny):
    files, info, _tok, upto, comma = _setup(tiny)
    core = PreprocessorCore(files, info, StopEngine(upto))
    _, text, last = await _answer(core, SamplingParams(stop=("1",), stop_token_ids=(comma,)))
    assert last.stop_reason == "1" and last.stop_token_id is None and last.stop_reason_json == "1" and text == ""


async def test_grpc_chunks_and_json_carry_the_token(tiny):
    files, info, _tok, upto, comma = _setup(tiny)
    core = PreprocessorCore(files, info, StopEngine(upto))
    chunks, _, last = await _answer(core, SamplingParams(stop_token_ids=(comma,)))
    assert Chunk.from_pb(chunk_pb(last)).stop_token_id == comma
    assert all(Chunk.from_pb(chunk_pb(c)).stop_token_id is None for c in chunks[:-1])
    strings = core.token_strings()
    for shape in (ChatShape("r", "m", strings), Shape("r", "m", strings)):
        collected = Collected()
        for c in chunks:
            collected.add(c)
        assert shape.response(whole_answer([collected]))["choices"][0]["stop_reason"] == comma
        streamed = [shape.chunk(c) for c in chunks]
        assert streamed[-1]["choices"][0]["stop_reason"] == comma
