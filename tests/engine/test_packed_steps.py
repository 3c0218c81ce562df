"""Mixed steps as one packed forward (engine/forwards.py `packed`): the running rows' decode tokens and the prompt
positions of arrivals in one row of tokens, attention split per sequence. Every row and every prompt (whole ones, and
a long one in parts across steps; with images where the family takes them) gets exactly its solo greedy tokens, for a
Llama-style family, Idefics3, and the Qwen2 text stacks (Qwen2-VL's M-RoPE, LLaVA-OneVision); and the engine takes
that path only for the families that allow it."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from engine.config import EngineConfig
from engine.loader import load
from splice.engine_request import EngineRequest, NamedTensor
from tests.engine.engine_factories import collect, random_ids, start_engine, text_request
from tests.engine.family_cases import CASES
from tests.engine.runner_rows import Part, Rows

PACKED = ("tiny-text", "tiny-idefics3", "tiny-qwen2-vl", "tiny-llava-onevision")
STEPS = 6  # decode steps after the last prompt is in


@pytest.fixture(scope="module", params=PACKED)
def case_family(request, tiny_dirs):
    case = next(c for c in CASES if c.tiny == request.param)
    return case, load(EngineConfig(model=str(tiny_dirs[case.tiny]))).family, tiny_dirs[case.tiny]


def _prompts(case, family, model_dir) -> list:
    """Two text prompts of different lengths (so the rows are left-padded), two arrivals, and a long prompt: image
    prompts for the arrival and the long one where the family takes images."""
    text = [EngineRequest(f"t{k}", random_ids(n, seed=k)) for k, n in enumerate((6, 13, 9))]
    if case.images:
        ids, tensors = case.inputs(model_dir)
        image = EngineRequest("img", ids, [], [NamedTensor(k, v) for k, v in tensors.items()])
        ids, tensors = case.inputs(model_dir, "Describe every detail of this picture, please.", shift=3)
        long = EngineRequest("long", ids, [], [NamedTensor(k, v) for k, v in tensors.items()])
    else:
        image = EngineRequest("img", random_ids(21, seed=7))
        long = EngineRequest("long", random_ids(40, seed=8))
    return [family.prompt(r) for r in (*text, image, long)]


def _solo(family, prompt, n: int) -> list[int]:
    runner = Rows(family)
    tokens = runner.prefill([0], [prompt]).argmax(-1).tolist()
    while len(tokens) < n:
        tokens += runner.decode(tokens[-1:]).argmax(-1).tolist()
    return tokens


def test_packed_steps_give_every_row_and_prompt_its_solo_tokens(case_family):
    case, family, model_dir = case_family
    assert family.packs_mixed_steps
    prompts = _prompts(case, family, model_dir)
    long = prompts[4]
    cuts = [0, 5, len(long.token_ids) // 2, len(long.token_ids)]  # the long prompt over three steps
    runner = Rows(family)
    got: dict[int, list[int]] = {}

    def record(seqs, logits):
        for s, t in zip(seqs, logits.argmax(-1).tolist(), strict=True):
            got.setdefault(s, []).append(t)

    def step(parts):
        seqs = runner.seq_ids
        decoded, prefilled = runner.mixed([got[s][-1] for s in seqs], parts)
        record(seqs, decoded)
        record([p.seq_id for p in parts if p.end == len((p.prompt or long).token_ids)], prefilled)

    record([0, 1], runner.prefill([0, 1], prompts[:2]))  # left-padded: rows start at different columns
    step([Part(2, prompts[2], 0, len(prompts[2].token_ids)),
          Part(3, prompts[3], 0, len(prompts[3].token_ids))])  # two whole prompts join
    runner.remove({1})  # the last row moves into its slot
    for k, (start, end) in enumerate(itertools.pairwise(cuts)):
        step([Part(4, long if k == 0 else None, start, end)])
        assert (runner.last.done == [0]) == (end == cuts[-1])  # its row joins with its last part only
    assert runner.seq_ids == [0, 2, 3, 4]
    for _ in range(STEPS):
        record(runner.seq_ids, runner.decode([got[s][-1] for s in runner.seq_ids]))
    for s, tokens in got.items():
        assert tokens == _solo(family, prompts[s], len(tokens)), f"sequence {s}"


def test_mixed_logits_equal_a_decode_step_and_a_prefill(case_family):
    """The packed forward's logits are the two forwards' (not only their argmax)."""
    case, family, model_dir = case_family
    prompts = _prompts(case, family, model_dir)
    ref, packed = Rows(family), Rows(family)
    tokens = ref.prefill([0, 1, 2], prompts[:3]).argmax(-1).tolist()
    packed.prefill([0, 1, 2], prompts[:3])
    want_rows = ref.decode(tokens)
    want_prompt = ref.prefill([3], [prompts[3]])
    rows, first = packed.mixed(tokens, [Part(3, prompts[3], 0, len(prompts[3].token_ids))])
    torch.testing.assert_close(rows, want_rows, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first, want_prompt, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tiny", ["tiny-text", "tiny-gemma3"])
async def test_the_engine_packs_mixed_steps_only_where_the_family_allows(tiny, tiny_dirs):
    engine = start_engine(tiny_dirs[tiny], mixed_prefill_tokens=8)
    try:
        reqs = [text_request(random_ids(n, seed=k), f"r{k}", max_tokens=m)
                for k, (n, m) in enumerate(((5, 200), (30, 10), (7, 10)))]
        solo = [(await collect(engine, r))[0] for r in reqs]
        streaming = asyncio.Event()  # the first request's own output (the runner may still hold the last solo row)

        async def late(k, r):
            if k:
                await streaming.wait()
            tokens = []
            async for out in engine.generate(r):
                tokens += out.token_ids
                streaming.set()
            return tokens

        before = engine.packed_steps
        assert list(await asyncio.gather(*(late(k, r) for k, r in enumerate(reqs)))) == solo
        assert (engine.packed_steps > before) == engine.family.packs_mixed_steps
    finally:
        engine.stop()
