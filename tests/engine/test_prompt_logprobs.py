"""Prompt logprobs (engine/prompt_logprobs.py) equal HF: log_softmax of HF's own forward logits on the same inputs, at
every prompt position, for a text family, vision families with an image and hybrid families; whether the prompt is
prefilled at once, in chunks (its logits in chunks too), over several steps beside running rows, or packed into a
mixed step. Requests without them keep the last-position logits only; prompt embeddings are refused.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

import engine.forwards as forwards
import engine.prompt_logprobs as engine_plp
from engine.config import EngineConfig
from engine.loader import load
from engine.sampler import make_generator, sample
from splice.engine_request import EngineRequest, NamedTensor
from splice.errors import InvalidArgument
from splice.prompt_logprobs import PromptLogprobs
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, random_ids, text_request, with_embed_span
from tests.engine.family_cases import CASES, FamilyCase
from tests.engine.runner_rows import Rows

K = 5
CASE = {c.tiny: c for c in CASES}
# a text family; vision families with an image (one contiguous run; M-RoPE; tiled); hybrid families (Mamba2 +
# attention; gated delta-net + attention with M-RoPE)
FAMILIES = ["tiny-text", "tiny-llava", "tiny-qwen2-vl", "tiny-smolvlm", "tiny-nemotron-omni", "tiny-qwen3.5"]
TEXT = "Tell me a long story about a cat and a dog, and then another one about a bird."


def hf_reference(case: FamilyCase, model, family, ids: list[int], tensors: dict) -> torch.Tensor:
    """log_softmax of HF's forward logits at every position: [P, vocab]."""
    with torch.inference_mode():
        embeds = family.lookup(torch.tensor(ids)).clone()
        return case.hf_logits(model, ids, embeds, tensors).log_softmax(-1)


def assert_equals_hf(got: PromptLogprobs, ids: list[int], want: torch.Tensor, k: int = K) -> None:
    """`got` (a whole prompt's) against HF's log_softmax [P, vocab]: each prompt token's logprob and rank, and the k
    most likely tokens (their values; their IDs where no near-tie makes the order a matter of rounding)."""
    assert got.token_ids == tuple(ids) and got.first == 0 and got.k == k
    targets = torch.tensor(ids[1:])
    rows = want[:-1]  # position p's logits score the token at p + 1
    picked = rows.gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(got.logprobs), picked, atol=2e-4, rtol=1e-4)
    ranks = (rows >= picked[:, None]).sum(-1)
    assert torch.equal(torch.tensor(got.ranks), ranks) or \
        (torch.tensor(got.ranks) - ranks).abs().max() <= 1  # a token within rounding of another may swap with it
    values, top = rows.topk(k, dim=-1)
    torch.testing.assert_close(torch.tensor(got.top_logprobs).view(-1, k), values, atol=2e-4, rtol=1e-4)
    clear = torch.cat([values[:, :-1] - values[:, 1:] > 1e-3, torch.ones(len(rows), 1, dtype=torch.bool)], 1)
    assert torch.equal(torch.tensor(got.top_ids).view(-1, k)[clear], top[clear])
    assert [e is None for e in got.entries()] == [True] + [False] * (len(ids) - 1)



def _request(ids, tensors, request_id="plp", **sampling) -> EngineRequest:
    return EngineRequest(request_id, list(ids), tensors=[NamedTensor(k, v) for k, v in tensors.items()],
                         sampling=SamplingParams(**{"temperature": 0.0, "max_tokens": 3, "prompt_logprobs": K,
                                                    **sampling}))


@pytest.mark.parametrize("name", FAMILIES)
async def test_prompt_logprobs_equal_hf_on_text_and_on_an_image(name, engines, tiny_dirs):
    case = CASE[name]
    engine = engines(name)
    for images in ([0, 1] if case.images else [0]):
        ids, tensors = case.inputs(tiny_dirs[name], TEXT if not images else "What is shown?", images=images)
        tokens, outs = await collect(engine, _request(ids, tensors))
        got = outs[0].prompt_logprobs
        assert got is not None and all(o.prompt_logprobs is None for o in outs[1:])
        assert_equals_hf(got, ids, hf_reference(case, engine.m.model, engine.m.family, ids, tensors))
        assert tokens == (await collect(engine, _request(ids, tensors, prompt_logprobs=None)))[0]


async def test_zero_alternatives_and_a_one_token_prompt(engines, tiny_dirs):
    engine = engines("tiny-text")
    ids = random_ids(12, seed=3)
    got = (await collect(engine, _request(ids, {}, prompt_logprobs=0)))[1][0].prompt_logprobs
    assert got.k == 0 and len(got.logprobs) == 11 and got.top_ids == ()
    one = (await collect(engine, _request(ids[:1], {})))[1][0].prompt_logprobs
    assert one == PromptLogprobs((ids[0],)) and one.entries() == [None]


@pytest.mark.parametrize("name", ["tiny-text", "tiny-qwen2-vl"])
def test_a_prompt_prefilled_in_chunks_with_its_logits_in_chunks_equals_hf(name, tiny_dirs, monkeypatch):
    monkeypatch.setattr(forwards, "PREFILL_CHUNK", 7)
    case = CASE[name]
    family = load(EngineConfig(model=str(tiny_dirs[name]))).family
    # a few positions per chunk of logits: the [positions, vocab] tensor never holds the prompt's
    monkeypatch.setattr(engine_plp, "LOGIT_ELEMENTS", 3 * family.embed.weight.shape[0])
    ids, _ = case.inputs(tiny_dirs[name], TEXT, images=0)
    assert len(ids) > 3 * 7 and family.chunkable(family.prompt(_request(ids, {})))
    prompt = family.prompt(_request(ids, {}))
    runner = Rows(family)
    first = runner.prefill([4], [prompt])
    got = runner.take_prompt_logprobs(4)
    assert runner.take_prompt_logprobs(4) is None  # taken once
    want = hf_reference(case, family.model, family, ids, {})
    assert_equals_hf(got, ids, want)
    torch.testing.assert_close(first[0].log_softmax(-1), want[-1], atol=2e-4, rtol=1e-4)


def test_only_the_asking_prompt_of_a_padded_group_is_scored(tiny_dirs):
    case = CASE["tiny-text"]
    family = load(EngineConfig(model=str(tiny_dirs["tiny-text"]))).family
    a, b, c = random_ids(9, seed=1), random_ids(15, seed=2), random_ids(4, seed=3)
    prompts = [family.prompt(_request(a, {}, prompt_logprobs=None)), family.prompt(_request(b, {})),
               family.prompt(_request(c, {}, prompt_logprobs=2))]
    runner = Rows(family)
    runner.prefill([1, 2, 3], prompts)
    assert runner.take_prompt_logprobs(1) is None
    assert_equals_hf(runner.take_prompt_logprobs(2), b, hf_reference(case, family.model, family, b, {}))
    assert_equals_hf(runner.take_prompt_logprobs(3), c, hf_reference(case, family.model, family, c, {}), k=2)
    assert sorted(i for i, _ in runner.last.scores) == [1, 2]  # the runner scored the asking prompts' positions only


@pytest.mark.parametrize("name", ["tiny-text", "tiny-gemma3"])
async def test_prompts_joining_running_rows_give_their_solo_prompt_logprobs(name, engines, tiny_dirs):
    """A prompt prefilled beside decoding rows: packed into a mixed step where the family packs, or over several
    steps (mixed_prefill_tokens smaller than the prompt): the same values as alone."""
    engine = engines(name, mixed_prefill_tokens=6)
    long = CASE[name].inputs(tiny_dirs[name], TEXT, images=0)[0]
    short = random_ids(5, seed=9)
    solo = [(await collect(engine, _request(p, {}, f"solo{i}")))[1][0].prompt_logprobs
            for i, p in enumerate((long, short))]
    parts, packed = [], engine.packed_steps
    execute = engine.runner.execute

    def counted(tokens, prompt_parts, *rest):  # calls through: which parts the prompts were prefilled in
        parts.extend(p.start for p in prompt_parts)
        return execute(tokens, prompt_parts, *rest)

    engine.runner.execute = counted
    runner = engine.generate(text_request(random_ids(6, seed=4), "runner", max_tokens=60))
    await anext(runner)  # it decodes while the others join
    together = await asyncio.gather(*(collect(engine, _request(p, {}, f"joined{i}")) for i, p in
                                      enumerate((long, short))))
    await runner.aclose()
    del engine.runner.execute
    if engine.m.family.packs_mixed_steps:
        assert engine.packed_steps > packed + 1  # the long one in parts, packed beside the running row
    else:
        assert len([s for s in parts if s > 0]) >= 2  # the long one over several steps
    for (_, outs), want in zip(together, solo, strict=True):
        got = outs[0].prompt_logprobs
        assert got.token_ids == want.token_ids and got.ranks == want.ranks and got.top_ids == want.top_ids
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=1e-4, rtol=1e-4)
    for _ in range(1000):  # the closed "runner" leaves at the next step: no record (nor its prompt logprobs) stays
        if not engine.requests:
            break
        await asyncio.sleep(0.01)
    assert not engine.requests


async def test_prompt_logprobs_with_prompt_embeds_are_refused(engines):
    engine = engines("tiny-text")
    rows = torch.randn(3, engine.info.hidden_size)
    with pytest.raises(InvalidArgument, match="prompt_logprobs is not compatible with prompt embeds"):
        await collect(engine, with_embed_span(random_ids(4, seed=1), {}, 2, rows, prompt_logprobs=1))
    assert len((await collect(engine, text_request(random_ids(4, seed=1), max_tokens=2)))[0]) == 2


def test_logprob_token_ids_give_exactly_those_tokens_logprobs():
    logits = torch.randn(3, 50)
    params = [SamplingParams(temperature=0.0, logprobs=True, logprob_token_ids=(7, 3, 7)),
              SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2),
              SamplingParams(temperature=0.0, logprobs=True, logprob_token_ids=(49,), top_logprobs=1)]
    gens = [make_generator(0, torch.device("cpu")) for _ in params]
    tokens, _, tops = sample(logits, params, gens)
    every = logits.log_softmax(-1)
    assert tops[0][0] == (7, 3, 7)
    torch.testing.assert_close(torch.tensor(tops[0][1]), every[0, [7, 3, 7]])
    assert tops[1][0] == tuple(every[1].topk(2).indices.tolist())
    assert tops[2][0] == (49,) and tops[2][1][0] == pytest.approx(float(every[2, 49]))
    assert tokens == logits.argmax(-1).tolist()
