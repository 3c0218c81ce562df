"""Processors whose video processor needs torchvision are built from their tokenizer and PIL image processor."""

from __future__ import annotations

import json

import pytest
import transformers

from preprocessor.images_only import LEFT_OUT, images_only
from preprocessor.model_files import load_model_files, load_processor


@pytest.mark.parametrize(("name", "cls"), [("tiny-llava-onevision", "LlavaOnevisionProcessor"),
                                           ("tiny-smolvlm", "SmolVLMProcessor")])
def test_the_real_class_without_its_video_processor(tiny_dirs, tmp_path, name, cls):
    processor = load_processor(tiny_dirs[name])
    assert isinstance(processor, getattr(transformers, cls)) and type(processor).__name__ == cls
    assert not set(LEFT_OUT) & set(processor.get_attributes())
    assert type(processor.image_processor).__name__.endswith("Pil")
    processor.save_pretrained(tmp_path)  # writes back what the builder wrote
    for file in ("processor_config.json", "chat_template.jinja"):
        assert (tmp_path / file).read_text() == (tiny_dirs[name] / file).read_text(), file


def test_a_processor_with_nothing_to_leave_out_is_untouched():
    assert images_only(transformers.LlavaProcessor).get_attributes() == transformers.LlavaProcessor.get_attributes()


def test_real_qwen2_vl_files_load(shared_models):
    path = shared_models / "Qwen__Qwen2-VL-2B-Instruct"
    if not (path / "preprocessor_config.json").exists():
        pytest.skip("no Qwen2-VL processor files")
    files = load_model_files(path)
    want = json.loads((path / "preprocessor_config.json").read_text())["processor_class"]
    assert type(files.processor).__name__ == want and files.accepts_images
