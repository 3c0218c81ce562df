"""Processors with a part that needs torchvision (a video processor, or a torchvision-only image processor) are
built from their loadable parts: the model's own processor class, its PIL image processor, no video processor."""

from __future__ import annotations

import json

import pytest
import transformers

from preprocessor.model_files import load_model_files, load_processor
from preprocessor.processor_parts import NoVideoProcessor, save_without_missing_parts

NEEDS_PARTS = [("tiny-llava-onevision", "LlavaOnevisionProcessor"), ("tiny-smolvlm", "SmolVLMProcessor"),
               ("tiny-gemma4", "Gemma4Processor"), ("tiny-qwen2-vl", "Qwen2VLProcessor"),
               ("tiny-qwen3.5", "Qwen3VLProcessor"), ("tiny-lfm2-vl", "Lfm2VlProcessor"),
               ("tiny-nemotron-omni", "NemotronH_Omni_Reasoning_V3Processor")]


@pytest.mark.parametrize(("name", "cls"), NEEDS_PARTS)
def test_the_real_class_from_its_loadable_parts(tiny_dirs, tmp_path, name, cls):
    processor = load_processor(tiny_dirs[name])
    assert isinstance(processor, getattr(transformers, cls)) and type(processor).__name__ == cls
    assert type(processor.image_processor).__name__.endswith("Pil")
    video = getattr(processor, "video_processor", None)
    assert video is None or isinstance(video, NoVideoProcessor)
    if video is not None:
        processor.video_processor = None  # as the builder had it
        save_without_missing_parts(processor, tmp_path)  # writes back what the builder wrote
        for file in ("processor_config.json", "chat_template.jinja"):
            assert (tmp_path / file).read_text() == (tiny_dirs[name] / file).read_text(), file


def test_a_video_is_refused_not_crashed():
    with pytest.raises(ValueError, match="torchvision"):
        NoVideoProcessor()(videos=[])


def test_real_qwen2_vl_files_load(shared_models):
    path = shared_models / "Qwen__Qwen2-VL-2B-Instruct"
    if not (path / "preprocessor_config.json").exists():
        pytest.skip("no Qwen2-VL processor files")
    files = load_model_files(path)
    want = json.loads((path / "preprocessor_config.json").read_text())["processor_class"]
    assert type(files.processor).__name__ == want and files.accepts_images
