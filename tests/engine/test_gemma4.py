"""Gemma 4 (tiny-gemma4, E2B-style): the properties the family needs, each shown against HF itself.

tiny-gemma4: 5 layers (sliding, sliding, full, sliding, full), sliding_window 8, the last 2 layers reusing the
keys/values of layers 1 and 2, per-layer inputs, final logit softcapping 30, at most 70 soft tokens per image.
"""

from __future__ import annotations

import pytest
import torch

from engine.models.gemma4 import Gemma4
from preprocessor.sentinel import FILLER_ID
from splice.engine_request import EngineRequest, NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, picture, start_engine, text_request, with_embed_span
from tests.engine.family_cases import CASES, chat_prompt, hf_processor
from tests.engine.runner_rows import Rows

N = 12  # generated tokens compared
CASE = next(c for c in CASES if c.tiny == "tiny-gemma4")
LONG = "The quick brown fox jumps over the lazy dog. Describe the image in one sentence, please."


@pytest.fixture(scope="module")
def gemma4(tiny_dirs):
    engine = start_engine(tiny_dirs["tiny-gemma4"])
    yield engine
    engine.stop()


def _hf_generate(model, n: int, **inputs) -> list[int]:
    """HF generate's greedy continuation (new tokens only; stops at EOS like the engine)."""
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=n, do_sample=False, pad_token_id=0)
    given = inputs.get("input_ids")
    return out[0, given.shape[1] if given is not None else 0:].tolist()


def _hf_greedy_from_embeds(model, embeds: torch.Tensor, per_layer: torch.Tensor, n: int,
                           eos: tuple[int, ...]) -> list[int]:
    """HF's forward and its own cache, greedy (its generate takes no inputs_embeds for this class): the first
    step from embeds [P, hidden] and per-layer inputs, the next ones from the generated IDs."""
    with torch.inference_mode():
        out = model(inputs_embeds=embeds[None], per_layer_inputs=per_layer, use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        while len(tokens) < n and tokens[-1] not in eos:
            out = model(input_ids=torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return tokens


def _runner_greedy(family: Gemma4, ids: list[int], n: int, eos: tuple[int, ...]) -> list[int]:
    """The runner's greedy tokens for one text prompt, stopping at EOS."""
    runner = Rows(family)
    tokens = [int(runner.prefill([0], [family.prompt(text_request(ids))])[0].argmax())]
    while len(tokens) < n and tokens[-1] not in eos:
        tokens.append(int(runner.decode([tokens[-1]])[0].argmax()))
    return tokens


class OneCausalMask(Gemma4):
    """What the bug report measured: the full causal mask for every layer, sliding ones included."""

    def attention_mask(self, step):
        full = self.causal_mask(step.mask, step.token_ids.shape[1])
        return {t: full for t in self.layer_types}


async def test_sliding_layers_need_their_own_mask(gemma4, tiny_dirs):
    model = gemma4.m.model
    ids, _ = CASE.inputs(tiny_dirs["tiny-gemma4"], LONG, images=0)
    assert len(ids) > 3 * model.config.text_config.sliding_window, "the prompt must pass the window"
    want = _hf_generate(model, N, input_ids=torch.tensor([ids]))
    got, _ = await collect(gemma4, text_request(ids, max_tokens=N, temperature=0.0))
    assert got == want
    family = gemma4.m.family
    one_mask = OneCausalMask(model, family.device, family.dtype)
    assert _runner_greedy(family, ids, N, gemma4.info.eos_token_ids) == want
    assert _runner_greedy(one_mask, ids, N, gemma4.info.eos_token_ids) != want, \
        "one causal mask lets sliding layers see past their window"


def test_kv_shared_layers_keep_no_cache_and_producers_keep_every_column(gemma4, tiny_dirs):
    tc = gemma4.m.model.config.text_config
    ids, _ = CASE.inputs(tiny_dirs["tiny-gemma4"], LONG, images=0)
    runner = Rows(gemma4.m.family)
    runner.prefill([0], [gemma4.m.family.prompt(text_request(ids))])
    runner.decode([5])
    layers = runner.batch.cache.layers
    assert len(layers) == tc.num_hidden_layers - tc.num_kv_shared_layers  # the reusing layers write nothing
    # sliding producers keep all columns too (the mask windows them), so join/leave pad every layer alike
    assert all(layer.keys.shape[2] == len(ids) + 1 for layer in layers)


async def test_prompt_embeds_rows_equal_hf_given_the_same_embeds_and_ids(gemma4, tiny_dirs):
    """What holds instead of "a text's rows act as the text": supplied rows get the pad ID's per-layer input, and
    the engine equals HF given the same inputs_embeds and the same IDs with the pad at the supplied positions."""
    model = gemma4.m.model
    pad = model.config.text_config.pad_token_id
    assert pad == FILLER_ID, "the preprocessor's filler is Gemma 4's pad: span positions read as the pad either way"
    ids, _ = CASE.inputs(tiny_dirs["tiny-gemma4"], "The color is purple and the sky is wide.", images=0)
    a, b = 3, len(ids) - 4
    with torch.inference_mode():
        rows = gemma4.m.embed(torch.tensor(ids[a:b])).clone()  # [b - a, hidden]: the text's own rows
    req = with_embed_span(ids[:a] + ids[b:], {}, a, rows, max_tokens=N)
    got, _ = await collect(gemma4, req)
    padded = torch.tensor(req.token_ids)  # filler (= pad) at the span
    with torch.inference_mode():
        x = gemma4.m.embed(padded).clone()
        x[a:b] = rows
        per_layer = model.model.language_model.get_per_layer_inputs(padded[None])
    assert got == _hf_greedy_from_embeds(model, x, per_layer, N, gemma4.info.eos_token_ids)
    as_text, _ = await collect(gemma4, text_request(ids, max_tokens=N, temperature=0.0))
    assert got != as_text, "the tiny model should tell the pad's per-layer inputs from the text's"


async def test_a_multimodal_token_id_in_the_text_reads_as_the_pad(gemma4, tiny_dirs):
    """HF replaces image/video/audio token IDs by the pad before any lookup, generated ones included."""
    model = gemma4.m.model
    ids, _ = CASE.inputs(tiny_dirs["tiny-gemma4"], LONG, images=0)
    ids = [*ids[:6], model.config.video_token_id, model.config.audio_token_id, *ids[6:]]
    got, _ = await collect(gemma4, text_request(ids, max_tokens=N, temperature=0.0))
    assert got == _hf_generate(model, N, input_ids=torch.tensor([ids]))
    image, pad = torch.tensor([model.config.image_token_id]), torch.tensor([model.config.text_config.pad_token_id])
    with torch.inference_mode():
        assert torch.equal(gemma4.m.family.lookup(image), gemma4.m.embed(pad))
        assert not torch.equal(gemma4.m.embed(image), gemma4.m.embed(pad))


def test_soft_tokens_per_image_vary_and_equal_hf(gemma4, tiny_dirs):
    processor = hf_processor(tiny_dirs["tiny-gemma4"])
    model = gemma4.m.model
    counts = []
    for size in ((70, 45), (30, 90), (200, 200)):
        out = processor(text=chat_prompt(processor, "Hi", 1), images=[picture(*size)], return_tensors="pt")
        tensors = {k: out[k] for k in ("pixel_values", "image_position_ids")}
        rows = gemma4.m.family.images.expected_rows(tensors)
        with torch.inference_mode():
            hf = model.model.get_image_features(**tensors).pooler_output
        assert rows == int((out["input_ids"] == model.config.image_token_id).sum()) == sum(len(f) for f in hf)
        counts.append(rows)
    assert len(set(counts)) == len(counts), f"soft tokens per image {counts}"


async def test_image_position_ids_off_the_grid_are_invalid_argument(gemma4, tiny_dirs):
    ids, tensors = CASE.inputs(tiny_dirs["tiny-gemma4"])
    pos = tensors["image_position_ids"].clone()
    pos[0, 1] = pos[0, 0]  # two patches at one place: not a grid the pooler can pool
    for bad in (pos, tensors["image_position_ids"].float(), tensors["image_position_ids"][:, :-9]):
        named = [NamedTensor("pixel_values", tensors["pixel_values"]), NamedTensor("image_position_ids", bad)]
        req = EngineRequest("bad", ids, tensors=named, sampling=SamplingParams(temperature=0.0, max_tokens=2))
        with pytest.raises(InvalidArgument, match="image_position_ids"):
            await collect(gemma4, req)
    assert len((await collect(gemma4, text_request(ids[:4], max_tokens=2)))[0]) == 2
