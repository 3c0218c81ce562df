"""Long prompts prefilled chunk by chunk (engine/forwards.py, PREFILL_CHUNK lowered so that tiny prompts span
several chunks): every family whose prefill may be chunked gives HF's own logits and greedy tokens, and a group
mixing chunked and padded prompts gives each its solo logits, in the caller's order."""

from __future__ import annotations

import pytest
import torch

import engine.forwards as forwards
from engine.config import EngineConfig
from engine.loader import load
from splice.engine_request import EngineRequest
from tests.engine.family_cases import CASES
from tests.engine.runner_rows import Rows

CHUNK = 7
TEXT = "Tell me a long story about a cat and a dog, and then another one about a bird."


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(forwards, "PREFILL_CHUNK", CHUNK)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.tiny) for c in CASES])
def test_chunked_prefill_equals_hf(case, tiny_dirs, small_chunks):
    family = load(EngineConfig(model=str(tiny_dirs[case.tiny]))).family
    ids, _ = case.inputs(tiny_dirs[case.tiny], TEXT, images=0)
    assert len(ids) > 3 * CHUNK
    prompt = family.prompt(EngineRequest("long", ids))
    runner = Rows(family)
    with torch.inference_mode():
        want = case.hf_first_logits(family.model, ids, family.lookup(torch.tensor(ids)), {})
    got = runner.prefill([0], [prompt])[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    tokens = [int(got.argmax())]
    for _ in range(4):
        tokens.append(int(runner.decode(tokens[-1:])[0].argmax()))
    hf = case.hf_generate(family.model, ids, {}, 5)
    assert tokens[:len(hf)] == hf


def test_a_group_mixing_chunked_and_padded_prompts_keeps_the_callers_order(tiny_dirs, small_chunks):
    family = load(EngineConfig(model=str(tiny_dirs["tiny-text"]))).family
    lengths = (5, 3 * CHUNK + 2, 4, 2 * CHUNK)  # long ones between short ones
    prompts = [family.prompt(EngineRequest(f"p{k}", list(range(40 + k, 40 + k + n)))) for k, n in enumerate(lengths)]
    solo = [Rows(family).prefill([0], [p])[0] for p in prompts]
    runner = Rows(family)
    got = runner.prefill([10, 11, 12, 13], prompts)
    for row, want in zip(got, solo, strict=True):
        torch.testing.assert_close(row, want, atol=1e-5, rtol=1e-5)
    assert runner.seq_ids == [10, 11, 12, 13]
    tokens = got.argmax(-1).tolist()
    step = runner.decode(tokens)  # rows in the caller's order, whatever their slots
    for k, p in enumerate(prompts):
        alone = Rows(family)
        alone.prefill([0], [p])
        torch.testing.assert_close(step[k], alone.decode([tokens[k]])[0], atol=1e-5, rtol=1e-5)
