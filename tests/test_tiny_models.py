"""The tiny models are real HF checkpoints: Auto classes load them offline and run a forward pass."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from PIL import Image
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
)

from app.tiny import BUILDER_VERSION, TINY_MODELS, ensure, model_dir
from app.tiny.builder import MARKER
from preprocessor.model_files import load_processor
from preprocessor.processor_parts import NoVideoProcessor


def _picture(w: int, h: int) -> Image.Image:
    pixels = bytes((x * 7 + y * 3 + c * 50) % 256 for y in range(h) for x in range(w) for c in range(3))
    return Image.frombytes("RGB", (w, h), pixels)


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_headroom_is_the_real_models(tiny_dirs, name):
    config = AutoConfig.from_pretrained(tiny_dirs[name])
    text_config = config.get_text_config()
    tok = AutoTokenizer.from_pretrained(tiny_dirs[name])
    if TINY_MODELS[name].headroom:
        assert text_config.vocab_size > len(tok) and text_config.vocab_size % 64 == 0
    else:
        assert text_config.vocab_size == len(tok)
    assert tok.chat_template, "every tiny model ships a chat template"


def test_text_model_forward(tiny_dirs):
    path = tiny_dirs["tiny-text"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hello!"}], add_generation_prompt=True,
                                     tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ["tiny-llava", "tiny-idefics3", "tiny-gemma3", "tiny-gemma4", "tiny-qwen3.5",
                                  "tiny-lfm2-vl", "tiny-llava-onevision", "tiny-smolvlm"])
def test_vision_model_forward(tiny_dirs, name):
    path = tiny_dirs[name]
    processor = load_processor(str(path))  # AutoProcessor(backend="pil"), or from its parts without torchvision
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is shown?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=prompt, images=[_picture(70, 45)], return_tensors="pt")
    image_token_id = model.config.image_token_id
    n_image_tokens = int((inputs.input_ids == image_token_id).sum())
    assert n_image_tokens > 0
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape[:2] == inputs.input_ids.shape
    assert torch.isfinite(out.logits).all()
    if name == "tiny-idefics3":
        # tiled: 2x1 tiles for a wide picture plus the global view, 4 tokens each, split by row/col tags
        ids = inputs.input_ids[0].tolist()
        positions = [i for i, t in enumerate(ids) if t == image_token_id]
        assert positions[-1] - positions[0] + 1 > n_image_tokens, "image tokens are not contiguous"
        assert inputs.pixel_values.shape[1] > 1


def test_gemma4_processor_loads_without_its_video_processor(tiny_dirs):
    """Gemma4Processor takes a video processor, which needs torchvision: the folder has none, AutoProcessor cannot
    build one without torchvision, and the processor's own class is built from its other parts instead."""
    path = tiny_dirs["tiny-gemma4"]
    if importlib.util.find_spec("torchvision") is None:
        with pytest.raises(Exception):  # noqa: B017 - whichever error transformers raises for the missing part
            AutoProcessor.from_pretrained(path, backend="pil")
    processor = load_processor(path)
    assert type(processor).__name__ == "Gemma4Processor" and isinstance(processor.video_processor, NoVideoProcessor)
    assert type(processor.image_processor).__name__ == "Gemma4ImageProcessorPil"
    assert len(processor.tokenizer) == AutoConfig.from_pretrained(path).text_config.vocab_size
    assert processor.image_token == "<|image|>" and processor.boi_token == "<|image>"


# The trained model is built once per session (a minute of training); test_colors_model.py checks its training is
# deterministic on a short run.
@pytest.mark.parametrize("name", sorted(n for n, m in TINY_MODELS.items() if not m.trained))
def test_build_is_deterministic_and_versioned(tmp_path, monkeypatch, tiny_dirs, name):
    monkeypatch.setenv("SPLICE_CACHE", str(tmp_path))
    fresh = ensure(name)
    assert fresh == model_dir(name) and f"-v{BUILDER_VERSION}-" in fresh.name
    assert json.loads((fresh / MARKER).read_text())["builder_version"] == BUILDER_VERSION
    for f in sorted(tiny_dirs[name].iterdir()):
        assert (fresh / f.name).read_bytes() == f.read_bytes(), f"{f.name} differs between two builds"
    # a cached build is reused, not rebuilt
    stamp = (fresh / "model.safetensors").stat().st_mtime_ns
    assert ensure(name) == fresh and (fresh / "model.safetensors").stat().st_mtime_ns == stamp
