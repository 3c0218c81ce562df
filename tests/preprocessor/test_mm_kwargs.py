"""mm_processor_kwargs: the image-processor arguments a family's processor takes (preprocessor/mm_kwargs.py) change
the image tokens exactly as HF's processor does with them, and the engine serves the result; any other key, or a
value past what the model's config allows, is a 400 naming it."""

from __future__ import annotations

import base64

import pytest

from preprocessor.core import PreprocessorCore
from splice.errors import InvalidArgument
from splice.sampling import SamplingParams
from tests.engine.engine_factories import collect, start_engine
from tests.preprocessor.http_face import http_face
from tests.preprocessor.pp_factories import conversation, hf_processor, picture, png_bytes


def _image_tokens(files, info, mm: dict) -> tuple[int, dict]:
    """(image tokens in the normalized prompt, its tensors) for one picture, with these kwargs."""
    conv = conversation(("user", [png_bytes(120, 80), "What is shown?"]), mm_processor_kwargs=mm)
    request = PreprocessorCore(files, info).normalize_chat(conv).request
    return request.token_ids.count(info.image_token_id), {t.name: t.tensor for t in request.tensors}


@pytest.mark.parametrize(("name", "kwargs"), [("tiny-idefics3", {"do_image_splitting": False}),
                                               ("tiny-smolvlm", {"do_image_splitting": False}),
                                               ("tiny-qwen2-vl", {"max_pixels": 1024}),
                                               ("tiny-qwen2.5-vl", {"max_pixels": 512}),
                                               ("tiny-qwen3.5", {"min_pixels": 256, "max_pixels": 1024})])
def test_a_taken_argument_changes_the_image_tokens_as_hf_does(tiny, tiny_dirs, name, kwargs):
    files, info = tiny[name]
    default, _ = _image_tokens(files, info, {})
    fewer, _ = _image_tokens(files, info, kwargs)
    assert 0 < fewer < default
    if "max_pixels" in kwargs:  # transformers 5's spelling of pixel bounds
        size = files.processor.image_processor.size
        kwargs = {"size": {"shortest_edge": kwargs.get("min_pixels", min(size["shortest_edge"], kwargs["max_pixels"])),
                           "longest_edge": kwargs["max_pixels"]}}
    hf = hf_processor(tiny_dirs[name])(text=files.image_placeholder, images=[picture(120, 80)], return_tensors="pt",
                                       images_kwargs=kwargs)
    assert fewer == int((hf["input_ids"] == info.image_token_id).sum())


@pytest.mark.parametrize(("name", "kwargs", "needle"), [
    ("tiny-text", {"do_image_splitting": False}, "takes none"),
    ("tiny-llava", {"size": {"shortest_edge": 8}}, "takes none"),
    ("tiny-idefics3", {"max_image_size": {"longest_edge": 512}}, "takes ['do_image_splitting']"),
    ("tiny-idefics3", {"do_image_splitting": "no"}, "must be true or false"),
    ("tiny-qwen2-vl", {"max_pixels": 10**9}, "from 1 to 4096"),
    ("tiny-qwen2-vl", {"min_pixels": 2048, "max_pixels": 1024}, "above max_pixels"),
    ("tiny-qwen2-vl", {"patch_size": 4}, "['max_pixels', 'min_pixels']"),
])
def test_other_keys_and_values_are_refused_by_name(tiny, name, kwargs, needle):
    files, info = tiny[name]
    parts = ["Hi"] if name == "tiny-text" else [png_bytes(), "Hi"]
    with pytest.raises(InvalidArgument, match="mm_processor_kwargs") as err:
        PreprocessorCore(files, info).normalize_chat(conversation(("user", parts), mm_processor_kwargs=kwargs))
    assert needle in err.value.message


async def test_the_engine_serves_a_smaller_grid(tiny, tiny_dirs):
    files, info = tiny["tiny-qwen2-vl"]
    conv = conversation(("user", [png_bytes(120, 80), "What is shown?"]), mm_processor_kwargs={"max_pixels": 1024})
    request = PreprocessorCore(files, info).normalize_chat(conv, SamplingParams(temperature=0.0, max_tokens=3,
                                                                                ignore_eos=True)).request
    engine = start_engine(tiny_dirs["tiny-qwen2-vl"])
    try:
        tokens, _ = await collect(engine, request)
    finally:
        engine.stop()
    assert len(tokens) == 3


async def test_over_http(tiny_dirs, tiny):
    url = "data:image/png;base64," + base64.b64encode(png_bytes(120, 80)).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is shown?"}]}]
    async with http_face(tiny_dirs, tiny, "tiny-idefics3") as face:
        lens = []
        for mm in (None, {"do_image_splitting": False}):
            r = await face.http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2,
                                                                    "mm_processor_kwargs": mm})
            assert r.status_code == 200, r.text
            lens.append(face.engine.requests[-1].prompt_len)
        assert lens[1] < lens[0]
        r = await face.http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2,
                                                                "mm_processor_kwargs": {"resample": 0}})
        assert r.status_code == 400 and "resample" in r.json()["error"]["message"]


def test_a_raised_min_pixels_counts_in_the_request_image_cap(tiny):
    """The processor resizes a smaller picture up to min_pixels: the request's pixel cap and its admission charge
    count each picture as at least that large, so small files cannot buy large decoded tensors."""
    from dataclasses import replace

    files, info = tiny["tiny-qwen2-vl"]
    most = files.processor.image_processor.size["longest_edge"]
    pictures = [png_bytes(8, 8), png_bytes(8, 8)]  # 64 pixels each
    limits = replace(PreprocessorCore(files, info).limits, max_request_image_pixels=most + 64)
    core = PreprocessorCore(files, info, limits=limits)
    served = core.normalize_chat(conversation(("user", [*pictures, "Compare."])))
    assert served.request.token_ids.count(info.image_token_id) > 0
    with pytest.raises(InvalidArgument, match=r"each at least \d+: mm_processor_kwargs.min_pixels"):
        core.normalize_chat(conversation(("user", [*pictures, "Compare."]),
                                         mm_processor_kwargs={"min_pixels": most, "max_pixels": most}))
