"""vLLM's JSON of logprobs (preprocessor/http/logprobs.py) from known values: the prompt_logprobs list, the completions
logprobs object with echoed prompt tokens, which entries show, -inf as vLLM writes it; and the public gRPC face's
split of a long prompt's logprobs, joined again by the clients."""

from __future__ import annotations

import json
import math

import pytest

import splice.prompt_logprobs as wire
from clients.types import ChunkReader
from preprocessor.encode import chunk_pbs
from preprocessor.http.logprobs import (
    completion_logprobs,
    output_steps,
    prompt_logprobs_json,
    prompt_steps,
    step_strings,
)
from preprocessor.outputs import GenerationChunk
from preprocessor.token_strings import TokenStrings
from splice.engine_output import FinishReason, Usage
from splice.prompt_logprobs import PromptLogprobs

TEXTS = {1: "<s>", 5: "A", 6: " cat", 7: " sat", 8: " dog", 9: "!", 10: "A"}  # 10 spells like 5


def texts(ids):
    return [TEXTS[i] for i in ids]


STRINGS = TokenStrings(texts, lambda ids: "".join(texts(ids)))


def prompt_json(plp: PromptLogprobs, strings: TokenStrings) -> list:
    """The prompt's logprobs as the response's JSON holds them, parsed."""
    return json.loads(prompt_logprobs_json(plp, strings).text())


# prompt <s> A cat sat; k = 2: at position 2 the prompt's token (6) is the most likely, at 3 it is not among the two
PLP = PromptLogprobs((1, 5, 6, 7), (-2.0, -0.5, -3.0), (4, 1, 7), (10, 5, 6, 8, 8, 9), (-1.0, -2.0, -0.5, -1.5,
                                                                                         -0.25, -1.0))


def test_prompt_logprobs_json_is_vllms_dict_per_position():
    got = prompt_json(PLP, STRINGS)
    assert got[0] is None and len(got) == 4
    assert list(got[1]) == ["5", "10"]  # the prompt's token first (rank 4), then the most likely; 5 is rank 2 there
    assert got[1]["5"] == {"logprob": -2.0, "rank": 2, "decoded_token": "A"}  # the top-k entry overwrites it
    assert got[1]["10"] == {"logprob": -1.0, "rank": 1, "decoded_token": "A"}
    assert list(got[2]) == ["6", "8"] and got[2]["6"]["rank"] == 1
    assert list(got[3]) == ["7", "8", "9"] and got[3]["7"] == {"logprob": -3.0, "rank": 7, "decoded_token": " sat"}
    assert prompt_logprobs_json(None, STRINGS) is None
    low = PromptLogprobs((1, 5), (-math.inf,), (9,), (), ())
    assert prompt_json(low, STRINGS)[1]["5"]["logprob"] == -9999.0  # JSON has no -inf; vLLM's stand-in


def test_completion_logprobs_with_echoed_prompt_then_generated_tokens():
    steps = prompt_steps(PLP) + output_steps((8, 9), (-0.25, -1.0), (8, 9, 9, 5), (-0.25, -2.0, -1.0, -3.0))
    got = completion_logprobs(steps, step_strings(steps, STRINGS), shown=2)  # logprobs=1: the token and the most likely
    assert got["tokens"] == ["<s>", "A", " cat", " sat", " dog", "!"]
    assert got["token_logprobs"] == [None, -2.0, -0.5, -3.0, -0.25, -1.0]
    assert got["top_logprobs"][0] is None
    # position 1: 5 ("A") and 10 ("A") share a text: the position's own token's logprob stays
    assert got["top_logprobs"][1] == {"A": -2.0}
    assert list(got["top_logprobs"][3].items()) == [(" sat", -3.0), (" dog", -0.25)]
    assert got["top_logprobs"][5] == {"!": -1.0, "A": -3.0}  # the chosen is the most likely: its 2 alternatives
    assert got["text_offset"] == [0, 3, 4, 8, 12, 16]
    streamed = completion_logprobs(steps[4:], step_strings(steps[4:], STRINGS), shown=2, offset=16)
    assert streamed["text_offset"] == [16, 20]
    listed_steps = output_steps((8,), (-0.25,), (9, 6, 9), (-1.0, -4.0, -1.0))
    listed = completion_logprobs(listed_steps, step_strings(listed_steps, STRINGS), shown=None)
    assert listed["top_logprobs"] == [{" dog": -0.25, "!": -1.0, " cat": -4.0}]  # all of them, the chosen first


def test_a_long_prompts_logprobs_cross_the_public_face_in_pieces(monkeypatch):
    monkeypatch.setattr(wire, "PIECE_POSITIONS", 3)
    chunk = GenerationChunk(" dog", (8,), (-0.25,), FinishReason.LENGTH, Usage(4, 1), prompt_logprobs=PLP)
    pbs = chunk_pbs(chunk)
    assert [list(pb.token_ids) for pb in pbs] == [[], [8]] and pbs[1].text == " dog"
    reader = ChunkReader()
    got = [c for pb in pbs if (c := reader.read(pb)) is not None]
    assert len(got) == 1 and got[0].prompt_logprobs == PLP and got[0].usage == Usage(4, 1)
    assert chunk_pbs(GenerationChunk("x", (1,)))[0].HasField("prompt_logprobs") is False
    with pytest.raises(ValueError, match="expected 0"):
        PromptLogprobs.join(PLP.split(3)[1:])
