"""Qwen2-VL / Qwen2.5-VL: what M-RoPE needs beyond the shared family suite (tests/engine/test_families.py).

- prompt positions are HF's get_rope_index on the processor's own image marks, and their max + 1 is not the
  token count (an image's tokens spread over its merged grid);
- decode continues from max + 1 (HF's rope delta): a decode step's logits equal HF's forward over the whole
  sequence, and continuing from the token count instead does not;
- images of different sizes make different token counts (from image_grid_thw), and generate equals HF's;
- the image tensors are checked against each other (rows == sum t*h*w, the patch width, the grid), naming the
  tensor; image marks are the engine's own (a caller's mm_token_type_ids is refused);
- the padded vocabulary: a sentinel lands inside the embedding table and still never reaches the engine.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.loader import load
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_model_files
from splice.engine_request import EngineRequest, NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, picture, start_engine, text_request, with_embed_span
from tests.engine.family_cases import CASES, chat_prompt
from tests.engine.runner_rows import Rows
from tests.preprocessor.pp_factories import conversation, model_info_from_config, png_bytes, rows

TINY = ["tiny-qwen2-vl", "tiny-qwen2.5-vl"]
CASE = {c.tiny: c for c in CASES}


@pytest.fixture(scope="module")
def loaded(tiny_dirs):
    return {name: load(EngineConfig(model=str(tiny_dirs[name]))) for name in TINY}


@pytest.fixture(scope="module")
def engines(tiny_dirs):
    started = {name: start_engine(tiny_dirs[name]) for name in TINY}
    yield started
    for engine in started.values():
        engine.stop()


def _processed(model_dir, sizes=((70, 45),), text="What is shown?"):
    """The HF processor's whole output (its own mm_token_type_ids included) for one user turn."""
    processor = load_model_files(model_dir).processor
    pics = [picture(*size, shift=40 * k) for k, size in enumerate(sizes)]
    return processor(text=chat_prompt(processor, text, len(pics)), images=pics, return_tensors="pt")


def _request(out, **sampling) -> EngineRequest:
    tensors = [NamedTensor(k, out[k]) for k in ("pixel_values", "image_grid_thw")]
    return EngineRequest("q", out["input_ids"][0].tolist(), tensors=tensors,
                         sampling=SamplingParams(**{"temperature": 0.0, **sampling}))


@pytest.mark.parametrize("name", TINY)
def test_prompt_positions_are_hf_rope_index_and_max_plus_one_is_not_the_length(name, loaded, tiny_dirs):
    m = loaded[name]
    out = _processed(tiny_dirs[name])
    prompt = m.family.prompt(_request(out))
    want, delta = m.model.model.get_rope_index(out["input_ids"], mm_token_type_ids=out["mm_token_type_ids"],
                                               image_grid_thw=out["image_grid_thw"])
    assert torch.equal(prompt.positions, want[:, 0])
    length = out["input_ids"].shape[1]
    assert prompt.next_position == length + int(delta) != length


@pytest.mark.parametrize("name", TINY)
def test_decode_continues_from_max_plus_one(name, loaded, tiny_dirs):
    m = loaded[name]
    out = _processed(tiny_dirs[name])
    req = _request(out)
    runner = Rows(m.family)
    prompt = m.family.prompt(req)
    token = int(runner.prefill([0], [prompt])[0].argmax())
    assert runner.batch.positions.tolist() == [prompt.next_position]
    got = runner.decode([token])[0]
    # HF's forward over prompt + token: its own positions for the whole sequence, no cache, no delta
    ids = torch.cat([out["input_ids"], torch.tensor([[token]])], dim=1)
    with torch.inference_mode():
        want = m.model(input_ids=ids, pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"],
                       mm_token_type_ids=torch.cat([out["mm_token_type_ids"], torch.zeros(1, 1, dtype=torch.long)],
                                                   dim=1)).logits[0, -1].float()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # the same step continued from the token count (no rope delta) is measurably another computation
    runner = Rows(m.family)
    runner.prefill([0], [prompt])
    runner.batch.positions = torch.tensor([len(req.token_ids)])
    assert (runner.decode([token])[0] - want).abs().max() > 1e-3


@pytest.mark.parametrize("name", TINY)
async def test_two_images_of_different_sizes_equal_hf_generate(name, engines, tiny_dirs):
    engine = engines[name]
    out = _processed(tiny_dirs[name], sizes=((70, 45), (30, 60)), text="Compare the two.")
    counts = (out["image_grid_thw"].prod(-1) // 4).tolist()
    ids = out["input_ids"][0].tolist()
    assert counts[0] != counts[1] and ids.count(engine.m.info.image_token_id) == sum(counts)
    n = 12
    got, _ = await collect(engine, _request(out, max_tokens=n, ignore_eos=True))
    tensors = {k: out[k] for k in ("pixel_values", "image_grid_thw")}
    with torch.inference_mode():
        hf = engine.m.model.generate(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                                     mm_token_type_ids=out["mm_token_type_ids"], **tensors, max_new_tokens=n,
                                     min_new_tokens=n, do_sample=False, pad_token_id=0)
    assert got == hf[0, len(ids):].tolist()
    assert len(got) == n


@pytest.mark.parametrize("name", TINY)
def test_image_tensors_are_checked_against_each_other(name, loaded, tiny_dirs):
    images = loaded[name].family.images
    out = _processed(tiny_dirs[name])
    pv, grid = out["pixel_values"], out["image_grid_thw"]
    assert images.expected_rows({"pixel_values": pv, "image_grid_thw": grid}) == int(grid.prod()) // 4
    bad = {
        "pixel_values": [{"pixel_values": pv[:-4], "image_grid_thw": grid},  # rows != t*h*w
                         {"pixel_values": pv[:, :-1], "image_grid_thw": grid},  # patch width
                         {"pixel_values": pv[None], "image_grid_thw": grid},  # not flat
                         {"pixel_values": pv.long(), "image_grid_thw": grid}],
        "image_grid_thw": [{"pixel_values": pv, "image_grid_thw": grid[0]},  # not [images, 3]
                           {"pixel_values": pv, "image_grid_thw": grid.float()},
                           {"pixel_values": pv, "image_grid_thw": grid + torch.tensor([0, 1, 0])},  # odd height
                           {"pixel_values": pv}],  # missing
        "mm_token_type_ids": [{"pixel_values": pv, "image_grid_thw": grid,
                               "mm_token_type_ids": out["mm_token_type_ids"]}],  # the engine's own, never a caller's
    }
    for tensor, cases in bad.items():
        for inputs in cases:
            with pytest.raises(InvalidArgument, match=tensor):
                images.expected_rows(inputs)


@pytest.mark.parametrize("name", TINY)
async def test_an_image_run_split_by_a_span_is_invalid_argument(name, engines, tiny_dirs):
    engine = engines[name]
    out = _processed(tiny_dirs[name])
    ids = out["input_ids"][0].tolist()
    first = ids.index(engine.m.info.image_token_id)
    tensors = {k: out[k] for k in ("pixel_values", "image_grid_thw")}
    split = with_embed_span(ids, tensors, first + 2, rows(3, engine.m.info.hidden_size), max_tokens=2)
    with pytest.raises(InvalidArgument, match="one contiguous run per image"):
        await collect(engine, split)
    assert len((await collect(engine, text_request(ids[:4], max_tokens=2)))[0]) == 2


@pytest.mark.parametrize("name", TINY)
def test_a_sentinel_lands_inside_the_padded_table_and_never_reaches_the_engine(name, tiny_dirs):
    path = tiny_dirs[name]
    files, info = load_model_files(path), model_info_from_config(path)
    assert files.base_vocab <= min(files.sentinels.ids) < info.vocab_rows  # an ID the engine would accept
    core = PreprocessorCore(files, info)
    conv = conversation(("user", ["Look:", rows(2, info.hidden_size), png_bytes(70, 45), rows(4, info.hidden_size)]))
    norm = core.normalize_chat(conv)
    assert files.sentinels.ids[0] in norm.raw_ids
    assert not set(norm.request.token_ids) & files.sentinels.id_set
    assert [s.length for s in norm.request.embed_spans] == [2, 4]


def test_the_qwen2_5_tower_attends_in_several_windows(loaded, tiny_dirs):
    from transformers.vision_utils import get_vision_window_index

    vc = loaded["tiny-qwen2.5-vl"].model.config.vision_config
    grid = _processed(tiny_dirs["tiny-qwen2.5-vl"])["image_grid_thw"]
    _, cu_window_seqlens = get_vision_window_index(grid, spatial_merge_size=vc.spatial_merge_size,
                                                   window_size=vc.window_size, patch_size=vc.patch_size)
    windows = len(torch.unique_consecutive(torch.as_tensor(cu_window_seqlens))) - 1
    assert windows > 1 and vc.fullatt_block_indexes == [vc.depth - 1]  # windowed blocks, then one full block
