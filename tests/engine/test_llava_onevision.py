"""LLaVA-OneVision: the rows an image makes depend on its size (any-resolution crops, unpadding, the
anyres_max shrink, newline rows); they are computed from image_sizes before any forward and must be exactly
what HF's pack_image_features makes. One contiguous run per image; vocabulary headroom keeps sentinels
inside the table, and they still never reach the engine."""

from __future__ import annotations

import pytest
import torch

from engine.models.llava_onevision import OnevisionImages
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_model_files, load_processor
from splice.engine_request import EngineRequest, NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, picture, start_engine, text_request
from tests.preprocessor.pp_factories import conversation, png_bytes, rows

TINY = "tiny-llava-onevision"
# (width, height): wide, tall, square, tiny, and sizes that pick each crop grid of the tiny's pinpoints
SIZES = [(70, 45), (45, 70), (32, 32), (5, 3), (3, 5), (64, 64), (100, 30), (30, 100), (64, 33), (33, 64),
         (129, 64), (200, 190), (61, 97)]


@pytest.fixture(scope="module")
def engine(tiny_dirs):
    started = start_engine(tiny_dirs[TINY])
    yield started
    started.stop()


@pytest.fixture(scope="module")
def processor(tiny_dirs):
    return load_processor(tiny_dirs[TINY])


def _process(processor, sizes, nested: bool = False, text: str = "What is shown?"):
    """(input_ids, tensors) of one user turn with one image per size, as the HF processor makes them; `nested`
    passes the images as one prompt's list (batch_num_images = [n]: HF does not crop them)."""
    pics = [picture(w, h, shift=17 * k) for k, (w, h) in enumerate(sizes)]
    content = [{"type": "image"}] * len(pics) + [{"type": "text", "text": text}]
    prompt = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    out = processor(text=[prompt], images=[pics] if nested else pics, return_tensors="pt")
    tensors = {k: out[k] for k in ("pixel_values", "image_sizes", "batch_num_images")}
    return out["input_ids"][0].tolist(), tensors


def _runs(ids: list[int], token: int) -> list[int]:
    """Lengths of the runs of `token` in `ids`."""
    runs, prev = [], False
    for t in ids:
        if t == token and prev:
            runs[-1] += 1
        elif t == token:
            runs.append(1)
        prev = t == token
    return runs


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_rows_from_image_sizes_equal_hf_pack_and_the_processors_tokens(engine, processor, size):
    geometry = engine.m.family.images
    ids, tensors = _process(processor, [size])
    with torch.inference_mode():
        packed = engine.m.model.get_image_features(**tensors).pooler_output  # HF's own pack, one tensor per image
    tokens = ids.count(engine.info.image_token_id)
    assert geometry.expected_rows(tensors) == tokens == sum(p.shape[0] for p in packed)
    assert _runs(ids, engine.info.image_token_id) == [tokens]  # one contiguous run


def test_the_sizes_cover_every_crop_grid_and_the_shrink(engine):
    geometry: OnevisionImages = engine.m.family.images
    grids = {geometry.crop_grid(h, w) for w, h in SIZES}
    assert grids == {(1, 1), (1, 2), (2, 1), (2, 2)}
    # a 2x2 grid of features is above the tiny's anyres_max budget: HF shrinks it, fewer rows than unshrunk
    side = geometry.grid_side
    assert geometry.rows(64, 64, cropped=True) < side**2 + (2 * side) * (2 * side + 1)


@pytest.mark.parametrize("nested", [False, True], ids=["each-cropped", "one-prompt-uncropped"])
async def test_two_images_greedy_equals_hf_generate(engine, processor, nested):
    sizes = [(70, 45), (30, 100)]
    ids, tensors = _process(processor, sizes, nested=nested)
    geometry = engine.m.family.images
    runs = _runs(ids, engine.info.image_token_id)
    assert runs == [geometry.rows(h, w, cropped=not nested) for w, h in sizes]
    assert tensors["batch_num_images"].tolist() == ([2] if nested else [1, 1])
    req = EngineRequest("two", ids, tensors=[NamedTensor(k, v) for k, v in tensors.items()],
                        sampling=SamplingParams(temperature=0.0, max_tokens=10))
    got, _ = await collect(engine, req)
    with torch.inference_mode():
        out = engine.m.model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                      dtype=torch.long), **tensors, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert got == out[0, len(ids):].tolist()


def _bad(tensors: dict, **changes) -> dict:
    return {**tensors, **changes}


async def test_malformed_image_inputs_name_the_tensor(engine, processor):
    ids, tensors = _process(processor, [(70, 45)])
    pv, sizes = tensors["pixel_values"], tensors["image_sizes"]
    cases = [
        ("image_sizes", _bad(tensors, image_sizes=sizes[:, :1].clone())),  # [images, 1]
        ("image_sizes", _bad(tensors, image_sizes=sizes.float())),
        ("image_sizes", _bad(tensors, image_sizes=torch.zeros_like(sizes))),
        ("image_sizes", {k: v for k, v in tensors.items() if k != "image_sizes"}),
        ("pixel_values", _bad(tensors, pixel_values=pv[:, :-1].clone())),  # a crop short
        ("pixel_values", _bad(tensors, pixel_values=pv[0].clone())),  # no crops dimension
        ("batch_num_images", _bad(tensors, batch_num_images=torch.tensor([2]))),
    ]
    for name, bad in cases:
        with pytest.raises(InvalidArgument, match=name):
            engine.m.family.images.expected_rows(bad)
        req = EngineRequest("bad", ids, tensors=[NamedTensor(k, v) for k, v in bad.items()],
                            sampling=SamplingParams(temperature=0.0, max_tokens=2))
        with pytest.raises(InvalidArgument, match=name):
            await collect(engine, req)
    # Well-formed tensors of another size make other rows: refused before any forward, by the token count
    _, other = _process(processor, [(45, 70)])
    req = EngineRequest("swapped", ids, tensors=[NamedTensor(k, v) for k, v in other.items()],
                        sampling=SamplingParams(temperature=0.0, max_tokens=2))
    with pytest.raises(InvalidArgument, match="image tokens"):
        await collect(engine, req)
    assert len((await collect(engine, text_request(ids[:4], max_tokens=2)))[0]) == 2


def test_sentinels_land_inside_the_padded_table_and_never_reach_the_engine(engine, tiny_dirs):
    files = load_model_files(tiny_dirs[TINY])
    info = engine.info
    # llava-onevision-qwen2's situation: every sentinel is a valid row of the table, so the engine's range check
    # cannot catch one; only the preprocessor's consumption keeps them out
    assert files.base_vocab <= min(files.sentinels.ids) and max(files.sentinels.ids) < info.vocab_rows
    core = PreprocessorCore(files, info)
    a, b = rows(3, info.hidden_size, seed=1), rows(5, info.hidden_size, seed=2)
    conv = conversation(("user", ["Soft:", a, png_bytes(70, 45), "and", b, png_bytes(30, 100, seed=3), "Describe."]))
    norm = core.normalize_chat(conv, SamplingParams(temperature=0.0, max_tokens=1), count_images=True)
    req = norm.request
    assert set(norm.raw_ids) & files.sentinels.id_set  # they were in the rendered prompt
    assert not set(req.token_ids) & files.sentinels.id_set
    assert [s.length for s in req.embed_spans] == [3, 5]
    geometry = engine.m.family.images
    runs = _runs(req.token_ids, info.image_token_id)
    assert list(norm.image_token_counts) == runs == [geometry.rows(45, 70, True), geometry.rows(100, 30, True)]
