"""What Gemma 3 needs beyond the shared suite (tests/engine/test_families.py), on tiny-gemma3:

- positions of one image attend to each other both ways at prefill (HF: `token_type_ids`), never to a later image;
- sliding-window layers get their own mask: one causal mask for every layer gives other logits;
- the embedding rows are scaled by sqrt(hidden), and those scaled rows are what prompt_embeds stand for;
- the table has headroom: a sentinel lands inside it, and still never reaches the engine;
- Gemma3ForCausalLM (text-only sizes) caps its final logits as HF does.
"""

from __future__ import annotations

import pytest
import torch

from engine.models import ModelFamily, StepInputs, family_for
from engine.models.gemma3 import Gemma3, image_blocks
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_model_files
from preprocessor.sentinel import FILLER_ID
from splice.engine_request import EngineRequest, NamedTensor
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, start_engine
from tests.engine.family_cases import CASES, image_token_types
from tests.engine.runner_rows import Rows
from tests.preprocessor.pp_factories import conversation, png_bytes, rows

CASE = next(c for c in CASES if c.tiny == "tiny-gemma3")
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def engine(tiny_dirs):
    started = start_engine(tiny_dirs["tiny-gemma3"])
    yield started
    started.stop()


class OneCausalMask(Gemma3):
    """Counterfactual: one causal mask for every layer, sliding ones included."""

    def attention_mask(self, step: StepInputs) -> torch.Tensor:
        # dense: given no mask at all, HF would build its own per-layer-type masks (the sliding one included)
        return self.causal_mask(step.mask, step.token_ids.shape[1], dense=True)


class CausalImages(Gemma3):
    """Counterfactual: image positions attend causally, like text."""

    def attention_mask(self, step: StepInputs) -> dict[str, torch.Tensor]:
        return super().attention_mask(StepInputs(step.token_ids, step.mask, None, step.span_mask))


def _prefill(family: ModelFamily, ids: list[int], tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    req = EngineRequest("r", ids, tensors=[NamedTensor(k, v) for k, v in tensors.items()])
    return Rows(family).prefill([0], [family.prompt(req)])[0]  # [vocab]


def _hf_logits(model: torch.nn.Module, ids: list[int], tensors: dict[str, torch.Tensor], **extra) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), **tensors, **extra).logits[0, -1].float()


def _counterfactual(cls: type[Gemma3], engine) -> Gemma3:
    f = engine.m.family
    return cls(f.model, f.device, f.dtype)


@pytest.mark.parametrize("images", [1, 2])
def test_each_image_attends_to_itself_both_ways(engine, tiny_dirs, images):
    ids, tensors = CASE.inputs(tiny_dirs["tiny-gemma3"], images=images)
    model = engine.m.model
    got = _prefill(engine.m.family, ids, tensors)
    torch.testing.assert_close(got, _hf_logits(model, ids, tensors, token_type_ids=image_token_types(model, ids)),
                               **TOL)
    # Without the image blocks, HF (no token_type_ids) and the engine agree on other logits.
    causal = _prefill(_counterfactual(CausalImages, engine), ids, tensors)
    torch.testing.assert_close(causal, _hf_logits(model, ids, tensors), **TOL)
    assert (got - causal).abs().max() > 1e-3  # ten times the tolerance


def test_an_image_never_sees_a_later_image(engine):
    image_mask = torch.tensor([[False, True, True, False, True, True, False]])
    assert image_blocks(image_mask).tolist() == [[-1, 0, 0, -1, 1, 1, -1]]
    step = StepInputs(torch.zeros(1, 7, dtype=torch.long), torch.ones(1, 7, dtype=torch.long), image_mask,
                      torch.zeros_like(image_mask))
    for layer_type, mask in engine.m.family.attention_mask(step).items():
        sees = mask[0, 0]  # [q, T] bool, True = attends
        assert sees[1, 2] and sees[4, 5], layer_type  # inside one image: both ways
        assert not sees[1, 4] and not sees[2, 5] and not sees[1, 3], layer_type  # not the text or image after it
        assert sees[5, 1] and not sees[3, 4], layer_type  # a later image sees an earlier one; text stays causal


def test_sliding_layers_need_their_own_mask(engine, tiny_dirs):
    window = engine.m.model.config.text_config.sliding_window
    ids, _ = CASE.inputs(tiny_dirs["tiny-gemma3"], "Tell me a long story about a cat and a dog.", images=0)
    assert len(ids) > 2 * window
    got = _prefill(engine.m.family, ids, {})
    torch.testing.assert_close(got, _hf_logits(engine.m.model, ids, {}), **TOL)
    one_mask = _prefill(_counterfactual(OneCausalMask, engine), ids, {})
    assert (got - one_mask).abs().max() > 1e-3


def test_prompt_rows_are_the_scaled_embedding_rows(engine):
    ids = torch.tensor([5, 20, 30])
    emb = engine.m.model.get_input_embeddings()
    hidden = engine.m.info.hidden_size
    with torch.inference_mode():
        torch.testing.assert_close(engine.m.embed(ids), emb.weight[ids] * torch.tensor(hidden**0.5))


async def test_sentinels_land_inside_the_table_and_never_reach_the_engine(engine, tiny_dirs):
    files = load_model_files(tiny_dirs["tiny-gemma3"])
    info = engine.info
    assert files.base_vocab < info.vocab_rows
    inside = [s for s in files.sentinels.ids if s < info.vocab_rows]
    assert inside and inside[0] == files.base_vocab  # the first sentinel is a valid row of the table
    a, b = rows(2, info.hidden_size, seed=1), rows(4, info.hidden_size, seed=2)
    conv = conversation(("user", [a, png_bytes(*CASE.picture_size), "Compare", b]))
    norm = PreprocessorCore(files, info).normalize_chat(conv, SamplingParams(temperature=0.0, max_tokens=1))
    req = norm.request
    assert set(norm.raw_ids) & set(inside)  # the rendered prompt held sentinels inside the table...
    assert not set(req.token_ids) & files.sentinels.id_set  # ...and none of them left the preprocessor
    assert all(req.token_ids[s.offset + k] == FILLER_ID for s in req.embed_spans for k in range(s.length))
    assert len((await collect(engine, req))[0]) == 1


def test_text_only_gemma3_caps_final_logits_as_hf(engine):
    from transformers import Gemma3ForCausalLM

    text_config = engine.m.model.config.text_config.__class__(
        **{**engine.m.model.config.text_config.to_dict(), "final_logit_softcapping": 0.5})
    assert family_for(text_config) is Gemma3
    torch.manual_seed(0)
    model = Gemma3ForCausalLM._from_config(text_config, attn_implementation="sdpa").eval()
    family = Gemma3(model, torch.device("cpu"), torch.float32)
    ids = list(range(10, 40))
    got = _prefill(family, ids, {})
    torch.testing.assert_close(got, _hf_logits(model, ids, {}), **TOL)
    family.softcap = None
    uncapped = _prefill(family, ids, {})
    assert got.abs().max() < 0.5 < uncapped.abs().max()
