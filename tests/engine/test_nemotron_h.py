"""Nemotron-H specifics on tiny-nemotron-omni (Mamba2 + attention + MoE, RADIO tower), beside the shared suite:

- left padding reaches the Mamba state unless those layers get the 2-D padding mask (shown both ways);
- rows joining and leaving the running batch keep their own conv / recurrent states and KV columns;
- a cancelled request's states leave the cache at once;
- the text-only decoder (NemotronHForCausalLM) is served too and equals HF's generate;
- the PIL image processor lays patches out as the model reads them.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from transformers.cache_utils import DummyLayer, LinearAttentionCacheLayerMixin

from engine.models.nemotron_h import NemotronH
from tests.engine.engine_factories import collect, picture, random_ids, start_engine, text_request
from tests.engine.family_cases import FamilyCase, hf_processor
from tests.engine.runner_rows import Rows

TINY = "tiny-nemotron-omni"
CASE = FamilyCase(TINY)


@pytest.fixture(scope="module")
def engine(tiny_dirs):
    e = start_engine(tiny_dirs[TINY])
    yield e
    e.stop()


def _prompts(engine, tiny_dirs):
    """An image prompt and a shorter text-only prompt, merged by the family."""
    from splice.engine_request import EngineRequest, NamedTensor

    ids, tensors = CASE.inputs(tiny_dirs[TINY], "Describe the picture in a few words.")
    image = EngineRequest("img", ids, tensors=[NamedTensor(k, v) for k, v in tensors.items()])
    text = EngineRequest("txt", random_ids(9, seed=3))
    family = engine.m.family
    return family.prompt(image), family.prompt(text)


class WithoutRecurrentMask(NemotronH):
    """The 4-D mask only, as an attention-only family would pass it: the Mamba layers then get no mask."""

    def attention_mask(self, step):
        full = super().attention_mask(step)["full_attention"]  # boolean, or None when nothing is padded
        if full is not None:  # additive, as it used to be: a padded query then attends to its padding uniformly
            full = torch.zeros(full.shape, dtype=self.dtype).masked_fill_(~full, torch.finfo(self.dtype).min)
        return {"full_attention": full}


def _rows(cache) -> set[int]:
    """Batch sizes held by every non-placeholder layer of the cache."""
    sizes = set()
    for layer in cache.layers:
        if isinstance(layer, DummyLayer):
            continue
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            sizes |= {s.shape[0] for s in (*layer.conv_states.values(), *layer.recurrent_states.values())}
        else:
            sizes |= {layer.keys.shape[0], layer.values.shape[0]}
    return sizes


def test_left_padding_reaches_the_mamba_state_without_the_2d_mask(engine, tiny_dirs):
    long, short = _prompts(engine, tiny_dirs)
    assert len(short.token_ids) < len(long.token_ids)  # the short one is left-padded in the pair
    family = engine.m.family

    def run(fam, prompts):
        """-> (first row's logits, its recurrent states, one per Mamba layer)."""
        runner = Rows(fam)
        logits = runner.prefill(list(range(len(prompts))), prompts)[0]
        layers = [x for x in runner.batch.cache.layers if isinstance(x, LinearAttentionCacheLayerMixin)]
        return logits, [x.recurrent_states[0][0] for x in layers]

    solo, solo_states = run(family, [short])
    padded, padded_states = run(family, [short, long])
    torch.testing.assert_close(padded, solo, atol=1e-5, rtol=1e-5)
    for got, want in zip(padded_states, solo_states, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6 * want.abs().max(), rtol=1e-4)

    unmasked = WithoutRecurrentMask(family.model, family.device, family.dtype)
    leaked, leaked_states = run(unmasked, [short, long])
    # padding went into the SSM state of the Mamba layer after attention (attention gives padded positions
    # nonzero outputs; before it they are zero rows), and from there into the logits
    assert max((g - w).abs().max() / w.abs().max() for g, w in zip(leaked_states, solo_states, strict=True)) > 0.05
    assert (leaked - solo).abs().max() > 1e-4


def test_rows_join_and_leave_with_their_own_states(engine, tiny_dirs):
    a, b = _prompts(engine, tiny_dirs)
    family = engine.m.family

    def solo(prompt, steps):
        runner = Rows(family)
        logits = [runner.prefill([0], [prompt])[0]]
        for _ in range(steps):
            logits.append(runner.decode([int(logits[-1].argmax())])[0])
        return logits

    want_a, want_b = solo(a, 5), solo(b, 6)
    runner = Rows(family)
    got_a = [runner.prefill([0], [a])[0]]
    for _ in range(2):
        got_a.append(runner.decode([int(got_a[-1].argmax())])[0])
    got_b = [runner.prefill([1], [b])[0]]  # joins a batch that is wider than its own prompt
    assert _rows(runner.batch.cache) == {2}
    for _ in range(3):
        both = runner.decode([int(got_a[-1].argmax()), int(got_b[-1].argmax())])
        got_a.append(both[0])
        got_b.append(both[1])
    runner.remove({0})  # a leaves: its states go, b's padding columns are trimmed
    assert _rows(runner.batch.cache) == {1}
    assert runner.batch.kv.width == len(b.token_ids) + 3
    for _ in range(3):
        got_b.append(runner.decode([int(got_b[-1].argmax())])[0])
    for got, want in ((got_a, want_a), (got_b, want_b)):
        assert [int(x.argmax()) for x in got] == [int(x.argmax()) for x in want]
        torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=1e-4, rtol=1e-4)


async def test_a_cancelled_request_frees_its_states_at_once(engine):
    keep = asyncio.ensure_future(collect(engine, text_request(random_ids(5, seed=1), "keep", max_tokens=200)))
    gen = engine.generate(text_request(random_ids(8, seed=2), "gone", max_tokens=1000))
    await gen.__anext__()
    for _ in range(500):
        if engine.runner.rows == 2:
            break
        await asyncio.sleep(0.01)
    assert _rows(engine.runner.batch.cache) == {2}
    await gen.aclose()  # the stream closed: the engine aborts "gone" between steps
    for _ in range(500):
        if engine.runner.rows == 1:
            break
        await asyncio.sleep(0.01)
    batch = engine.runner.batch
    assert batch is not None and _rows(batch.cache) == {1}
    assert len((await keep)[0]) == 200


async def test_the_text_only_decoder_is_served_and_equals_hf_generate(engine, tiny_dirs, tmp_path):
    from transformers import AutoTokenizer

    folder = tmp_path / "nemotron-h-text"
    engine.m.model.language_model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_dirs[TINY]).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "nemotron_h"
    text = start_engine(folder)
    try:
        assert isinstance(text.m.family, NemotronH) and not text.m.family.accepts_images
        ids, _ = CASE.inputs(tiny_dirs[TINY], "Tell me about the sea.", images=0)
        got, _ = await collect(text, text_request(ids, max_tokens=10, ignore_eos=False))
        assert got == FamilyCase(TINY, images=False).hf_generate(text.m.model, ids, {}, 10)
    finally:
        text.stop()


def test_pil_image_processor_patches_are_the_normalized_image_in_patch_order(tiny_dirs):
    ip = hf_processor(tiny_dirs[TINY]).image_processor
    side = ip.patch_size
    image = picture(8 * side, 6 * side)  # already a 6 x 8 grid inside [min, max] patches: no resize
    out = ip(images=[image], return_tensors="pt")
    assert out["image_grid_hw"].tolist() == [[6, 8]]
    x = (np.asarray(image, dtype=np.float32) / 255 - np.asarray(ip.image_mean)) / np.asarray(ip.image_std)
    x = torch.from_numpy(x).permute(2, 0, 1)  # [channels, height, width]
    patches = x.unfold(1, side, side).unfold(2, side, side)  # [channels, 6, 8, side, side]
    want = patches.permute(1, 2, 0, 3, 4).reshape(48, -1)  # row-major patches, each channel-major
    torch.testing.assert_close(out["pixel_values"], want.float(), atol=1e-5, rtol=1e-5)
