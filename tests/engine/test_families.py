"""What must hold for every model family (tiny random-weight models, CPU), one parametrized suite:

- greedy tokens for a text + image chat, and for text only, equal HF's own `generate` on the processor's output;
- embedding rows of a text's tokens sent as prompt_embeds give the text's tokens;
- a mixed request built by the preprocessor (text + two embeds spans of different lengths + image) carries no
  sentinel ID, and its spans and image rows land where HF puts them (first-step logits equal HF's forward);
- 8 concurrent requests of different lengths, joining and leaving at different steps, give their solo tokens;
- a malformed image tensor is INVALID_ARGUMENT naming it, and the engine keeps serving.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from engine.model_runner import ModelRunner
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_model_files
from splice.engine_request import NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, text_request, with_embed_span
from tests.engine.family_cases import CASES, FamilyCase
from tests.preprocessor.pp_factories import conversation, png_bytes, rows

N = 10  # generated tokens compared
GREEDY = dict(temperature=0.0)



def _ids(case: FamilyCase):
    return pytest.param(case, id=case.tiny)


ALL = [_ids(c) for c in CASES]
VISION = [_ids(c) for c in CASES if c.images]


def _request(ids, tensors, request_id="r", **sampling):
    from splice.engine_request import EngineRequest

    return EngineRequest(request_id, list(ids), tensors=[NamedTensor(k, v) for k, v in tensors.items()],
                         sampling=SamplingParams(**{**GREEDY, **sampling}))


@pytest.mark.parametrize("case", VISION)
async def test_text_and_image_greedy_equals_hf_generate(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    ids, tensors = case.inputs(tiny_dirs[case.tiny])
    got, _ = await collect(engine, _request(ids, tensors, max_tokens=N))
    assert got == case.hf_generate(engine.m.model, ids, tensors, N)


@pytest.mark.parametrize("case", ALL)
async def test_text_only_greedy_equals_hf_generate(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    ids, _ = case.inputs(tiny_dirs[case.tiny], "Tell me a story about a cat.", images=0)
    got, _ = await collect(engine, _request(ids, {}, max_tokens=N))
    assert got == case.hf_generate(engine.m.model, ids, {}, N)


@pytest.mark.parametrize("case", ALL)
async def test_embedding_rows_of_a_text_act_as_the_text(case, engines, tiny_dirs):
    if not case.embeds_act_as_text:
        pytest.skip(case.equivalence_note)
    engine = engines(case.tiny)
    ids, _ = case.inputs(tiny_dirs[case.tiny], "The color is purple and the sky is wide.", images=0)
    with torch.inference_mode():
        looked_up = engine.m.embed(torch.tensor(ids)).clone()  # [P, hidden]: the rows the model itself uses
    as_text, _ = await collect(engine, _request(ids, {}, max_tokens=N, ignore_eos=True))
    a, b = 2, len(ids) - 3  # a middle part supplied, the rest as text; then the whole prompt supplied
    part = with_embed_span(ids[:a] + ids[b:], {}, a, looked_up[a:b], max_tokens=N, ignore_eos=True)
    whole = with_embed_span([], {}, 0, looked_up, max_tokens=N, ignore_eos=True)
    assert (await collect(engine, part))[0] == as_text
    assert (await collect(engine, whole))[0] == as_text


@pytest.mark.parametrize("case", VISION)
async def test_mixed_request_from_the_preprocessor_lands_where_hf_puts_it(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    files = load_model_files(tiny_dirs[case.tiny])
    info = engine.info
    core = PreprocessorCore(files, info)
    a, b = rows(3, info.hidden_size, seed=1), rows(5, info.hidden_size, seed=2)
    conv = conversation(("user", ["Soft prompt:", a, png_bytes(*case.picture_size), "and", b, "Describe."]))
    req = core.normalize_chat(conv, SamplingParams(temperature=0.0, max_tokens=1)).request
    assert not set(req.token_ids) & files.sentinels.id_set and max(req.token_ids) < info.vocab_rows
    assert [s.length for s in req.embed_spans] == [3, 5]
    assert sum(t == info.image_token_id for t in req.token_ids) > 0
    # HF's own merge: the prompt rows with the supplied rows written at the spans; HF writes its image features
    with torch.inference_mode():
        x = engine.m.embed(torch.tensor(req.token_ids)).clone()  # [P, hidden]
        for span in req.embed_spans:
            x[span.offset:span.offset + span.length] = req.span_rows(span)
        want = case.hf_first_logits(engine.m.model, req.token_ids, x, req.model_inputs)
        got = ModelRunner(engine.m.family).prefill([0], [engine.m.family.prompt(req)])[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    tokens, _ = await collect(engine, req)
    assert tokens == [int(want.argmax())]


@pytest.mark.parametrize("case", ALL)
async def test_eight_concurrent_requests_give_their_solo_tokens(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    reqs = []
    for k in range(8):
        text = "word " * (3 + 5 * k)
        images = 1 if case.images and k % 3 == 0 else 0
        ids, tensors = case.inputs(tiny_dirs[case.tiny], text, images=images, shift=k)
        reqs.append(_request(ids, tensors, f"r{k}", max_tokens=4 + 3 * k, ignore_eos=True))
    solo = [(await collect(engine, r))[0] for r in reqs]

    async def staggered(k, r):
        await asyncio.sleep(0.02 * k)  # join while others decode; different max_tokens leave at different steps
        return (await collect(engine, r))[0]

    together = await asyncio.gather(*(staggered(k, r) for k, r in enumerate(reqs)))
    assert list(together) == solo


@pytest.mark.parametrize("case", VISION)
async def test_a_malformed_image_tensor_is_invalid_argument_naming_it(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    ids, tensors = case.inputs(tiny_dirs[case.tiny])
    name, pixels = next(iter(tensors.items()))
    for bad in (pixels[..., :-1], pixels.flatten()[: pixels.numel() // 2]):
        with pytest.raises(InvalidArgument, match=name):
            await collect(engine, _request(ids, {**tensors, name: bad.clone()}))
    assert len((await collect(engine, text_request(ids[:4], max_tokens=2)))[0]) == 2
