"""Fidelity: for SmolVLM-256M's real processor files, the preprocessor's IDs equal what HF's own
processor produces for the same conversation (sentinel spans aside). Skipped without ../shared/models."""

from __future__ import annotations

import io

import pytest
from PIL import Image as PILImage
from transformers import AutoProcessor

from preprocessor.core import PreprocessorCore
from tests.preprocessor.pp_factories import conversation, files_for, model_info_from_config, png_bytes, rows

pytestmark = pytest.mark.fidelity
SMOLVLM = "HuggingFaceTB__SmolVLM-256M-Instruct"


@pytest.fixture(scope="module")
def smolvlm(shared_models):
    path = shared_models / SMOLVLM
    info = model_info_from_config(path)
    assert info.vocab_rows == 49280
    return PreprocessorCore(files_for(path), info), AutoProcessor.from_pretrained(path, backend="pil")


IMG_A, IMG_B = png_bytes(70, 45), png_bytes(30, 60, seed=5)


def _hf_parts(parts):
    out = []
    for p in parts:
        if isinstance(p, bytes):
            out.append({"type": "image"})
        elif isinstance(p, str):
            out.append({"type": "text", "text": p})
    return out  # prompt_embeds parts have no HF counterpart: dropped


def _hf_ids(proc, turns):
    messages = [{"role": r, "content": _hf_parts([parts] if isinstance(parts, str) else parts)}
                for r, parts in turns]
    images = [PILImage.open(io.BytesIO(p)).convert("RGB") for _, parts in turns if not isinstance(parts, str)
              for p in parts if isinstance(p, bytes)]
    text = proc.apply_chat_template(messages, add_generation_prompt=True)
    return proc(text=text, images=images or None, return_tensors="pt")["input_ids"][0].tolist()


CONVERSATIONS = {
    "text": [("user", "What is the capital of France?")],
    "multi_turn": [("system", "Answer briefly."), ("user", "Hi!"), ("assistant", "Hello. How can I help?"),
                   ("user", "Tell me a joke.")],
    "image": [("user", [IMG_A, "Describe this image."])],
    "two_images": [("user", [IMG_A, "and", IMG_B, "What differs?"]), ("assistant", "Colors."),
                   ("user", ["Explain more."])],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_ids_equal_hf_processor(smolvlm, name):
    core, proc = smolvlm
    turns = CONVERSATIONS[name]
    got = core.normalize_chat(conversation(*turns)).request.token_ids
    assert got == _hf_ids(proc, turns)


def test_ids_with_embeds_equal_hf_outside_the_spans(smolvlm):
    core, proc = smolvlm
    a, b = rows(3, 576, seed=1), rows(7, 576, seed=2)
    turns = [("system", "Answer briefly."), ("user", [IMG_A, "Compare ", a, " and ", b, " please."])]
    norm = core.normalize_chat(conversation(*turns))
    req = norm.request
    s0, s1 = core.files.sentinels.ids[:2]
    # Before consumption the sentinels are past the 49280 embedding rows; after it, no ID is.
    assert min(core.files.sentinels.ids) >= 49280 == core.info.vocab_rows
    assert (norm.raw_ids.count(s0), norm.raw_ids.count(s1)) == (3, 7)
    assert max(req.token_ids) < 49280
    drop = {p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)}
    assert [s.length for s in req.embed_spans] == [3, 7]
    outside = [t for i, t in enumerate(req.token_ids) if i not in drop]
    assert outside == _hf_ids(proc, turns)


@pytest.mark.parametrize("name", ["image", "multi_turn"])
def test_llava_15_ids_equal_hf_processor(shared_models, name):
    # llava-1.5 has headroom (32002 tokens, 32064 rows): the same path must hold there too.
    path = shared_models / "llava-hf__llava-1.5-7b-hf"
    core = PreprocessorCore(files_for(path), model_info_from_config(path))
    turns = [t for t in CONVERSATIONS[name] if t[0] != "system"]
    got = core.normalize_chat(conversation(*turns)).request.token_ids
    assert got == _hf_ids(AutoProcessor.from_pretrained(path, backend="pil"), turns)
