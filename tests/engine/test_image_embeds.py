"""image_embeds, per vision family: a picture's own features (its family's vision tower and projector on the pixels
the preprocessor made of it), sent as image_embeds with the geometry the family needs, give the prompt IDs and the
greedy tokens of the picture itself; one image and two. And the engine refuses malformed supplied features."""

from __future__ import annotations

import pytest
import torch

from preprocessor.core import PreprocessorCore
from preprocessor.limits import Limits
from preprocessor.model_files import load_model_files
from splice.engine_request import IMAGE_EMBEDS, EngineRequest, NamedTensor
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, text_request
from tests.engine.family_cases import CASES
from tests.preprocessor.pp_factories import conversation, picture, png_bytes

N = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)
ON = Limits(enable_mm_embeds=True)
VISION = [pytest.param(c, id=c.tiny) for c in CASES if c.images]
# processor tensors that travel as geometry beside the features, by vLLM's key names
GEOMETRY_TENSORS = ("image_grid_thw", "image_sizes", "image_grid_hw")



def geometry(files, inputs: dict[str, torch.Tensor], sizes: list[tuple[int, int]]) -> list[dict]:
    """Each image's geometry as a caller who ran the model's own image processor would send it."""
    per_image: list[dict] = [{} for _ in sizes]
    for key in GEOMETRY_TENSORS:
        if key in inputs:
            for k, value in enumerate(inputs[key]):
                per_image[k][key] = value.tolist()
    tile_keys = {"Idefics3Processor": ("rows", "cols"), "SmolVLMProcessor": ("rows", "cols"),
                 "Lfm2VlProcessor": ("image_rows", "image_cols", "image_sizes")}.get(type(files.processor).__name__, ())
    for k, (w, h) in enumerate(sizes):
        if tile_keys:  # the image processor says how it tiled the picture when asked
            tiles = files.processor.image_processor([picture(w, h, seed=40 * k)], return_row_col_info=True)
            per_image[k] |= {key: tiles[key][0] for key in tile_keys}
    return per_image


@pytest.mark.parametrize("n_images", [1, 2])
@pytest.mark.parametrize("case", VISION)
async def test_a_pictures_own_features_sent_as_image_embeds_give_its_tokens(case, n_images, engines, tiny_dirs):
    engine = engines(case.tiny)
    files = load_model_files(tiny_dirs[case.tiny])
    core = PreprocessorCore(files, engine.info, limits=ON)
    sizes = [(case.picture_size[0] + 9 * k, case.picture_size[1] + 5 * k) for k in range(n_images)]
    pictures = [png_bytes(w, h, seed=40 * k) for k, (w, h) in enumerate(sizes)]
    by_picture = core.normalize_chat(conversation(("user", [*pictures, "What is shown?"])), GREEDY,
                                     count_images=True)
    with torch.inference_mode():
        features = engine.m.family.image_features(by_picture.request.model_inputs)  # [rows, hidden]
    per_image = features.split(list(by_picture.image_token_counts))
    parts = [{"image_embeds": rows.clone(), **g}
             for rows, g in zip(per_image, geometry(files, by_picture.request.model_inputs, sizes), strict=True)]
    by_embeds = core.normalize_chat(conversation(("user", [*parts, "What is shown?"])), GREEDY).request
    assert by_embeds.token_ids == by_picture.request.token_ids
    assert "pixel_values" not in by_embeds.model_inputs
    want, _ = await collect(engine, by_picture.request)
    got, _ = await collect(engine, by_embeds)
    assert got == want and len(got) == N


@pytest.mark.parametrize("case", VISION)
async def test_malformed_image_embeds_are_invalid_argument_naming_them(case, engines, tiny_dirs):
    engine = engines(case.tiny)
    core = PreprocessorCore(load_model_files(tiny_dirs[case.tiny]), engine.info, limits=ON)
    req = core.normalize_chat(conversation(("user", [png_bytes(*case.picture_size), "Hi"])), GREEDY).request
    with torch.inference_mode():
        features = engine.m.family.image_features(req.model_inputs)
    beside = {k: v for k, v in req.model_inputs.items() if k in engine.m.family.images.beside_embeds}
    good = {IMAGE_EMBEDS: features, **beside}
    bad_inputs = [
        ({**good, IMAGE_EMBEDS: features[:-1]}, r"image_embeds: \d+ rows, but|image tokens"),  # a row short
        ({**good, IMAGE_EMBEDS: features[:, :-1]}, r"image_embeds: shape"),  # not the hidden size
        ({**good, IMAGE_EMBEDS: features.to(torch.int32)}, r"image_embeds has dtype int32"),
        ({**good, IMAGE_EMBEDS: torch.full_like(features, float("nan"))}, r"image_embeds holds non-finite"),
        ({**good, "pixel_values": torch.zeros(1)}, r"'pixel_values' is not an input"),  # pixels beside features
    ]
    for inputs, message in bad_inputs:
        bad = EngineRequest("bad", list(req.token_ids), tensors=[NamedTensor(k, v) for k, v in inputs.items()],
                            sampling=GREEDY)
        with pytest.raises(InvalidArgument, match=message):
            await collect(engine, bad)
    assert len((await collect(engine, text_request(req.token_ids[:4], max_tokens=2)))[0]) == 2
