"""Fidelity: for Qwen2-VL-2B's real processor files, the preprocessor's IDs equal what HF's own Qwen2VLProcessor
produces for the same conversation (sentinel spans aside). Qwen2-VL has headroom (151657 tokens, 151936 rows):
the sentinels land inside the table, and still never reach the engine. Skipped without ../shared/models.

HF's processor is Qwen2VLProcessor itself, loaded without its video processor (which needs torchvision);
images and text go through exactly its code."""

from __future__ import annotations

import io

import pytest
from PIL import Image as PILImage

from preprocessor.core import PreprocessorCore
from preprocessor.processor_parts import load_processor_from_parts
from tests.preprocessor.pp_factories import conversation, files_for, model_info_from_config, png_bytes, rows

pytestmark = pytest.mark.fidelity
QWEN2_VL = "Qwen__Qwen2-VL-2B-Instruct"


@pytest.fixture(scope="module")
def qwen(shared_models):
    path = shared_models / QWEN2_VL
    if not path.is_dir():
        pytest.skip(f"{QWEN2_VL} not present in {shared_models}")
    info = model_info_from_config(path)
    assert info.vocab_rows == 151936
    hf = load_processor_from_parts(path)
    return PreprocessorCore(files_for(path), info), hf


IMG_A, IMG_B = png_bytes(70, 45), png_bytes(30, 60, seed=5)


def _hf_ids(proc, turns):
    def parts(ps):
        return [{"type": "image"} if isinstance(p, bytes) else {"type": "text", "text": p}
                for p in ps if isinstance(p, bytes | str)]  # prompt_embeds parts have no HF counterpart

    messages = [{"role": r, "content": p if isinstance(p, str) else parts(p)} for r, p in turns]
    images = [PILImage.open(io.BytesIO(p)).convert("RGB") for _, ps in turns if not isinstance(ps, str)
              for p in ps if isinstance(p, bytes)]
    text = proc.apply_chat_template(messages, add_generation_prompt=True)
    return proc(text=text, images=images or None, return_tensors="pt")["input_ids"][0].tolist()


CONVERSATIONS = {
    "text": [("user", "What is the capital of France?")],
    "system": [("system", "Answer briefly."), ("user", "Hi!")],
    "multi_turn": [("system", "Answer briefly."), ("user", "Hi!"), ("assistant", "Hello. How can I help?"),
                   ("user", "Tell me a joke.")],
    "image": [("user", [IMG_A, "Describe this image."])],
    "two_images": [("user", [IMG_A, "and", IMG_B, "What differs?"]), ("assistant", "Colors."),
                   ("user", ["Explain more."])],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_ids_equal_hf_processor(qwen, name):
    core, proc = qwen
    turns = CONVERSATIONS[name]
    got = core.normalize_chat(conversation(*turns)).request.token_ids
    assert got == _hf_ids(proc, turns)


def test_ids_with_embeds_equal_hf_outside_the_spans(qwen):
    core, proc = qwen
    a, b = rows(3, 1536, seed=1), rows(7, 1536, seed=2)
    turns = [("system", "Answer briefly."), ("user", [IMG_A, "Compare ", a, " and ", b, " please."])]
    norm = core.normalize_chat(conversation(*turns))
    req = norm.request
    s0, s1 = core.files.sentinels.ids[:2]
    # Headroom: the sentinels are inside the 151936 rows, an ID the engine would embed; none reaches it.
    assert core.files.base_vocab == 151657 <= s0 < s1 < core.info.vocab_rows
    assert (norm.raw_ids.count(s0), norm.raw_ids.count(s1)) == (3, 7)
    assert not set(req.token_ids) & core.files.sentinels.id_set
    drop = {p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)}
    assert [s.length for s in req.embed_spans] == [3, 7]
    outside = [t for i, t in enumerate(req.token_ids) if i not in drop]
    assert outside == _hf_ids(proc, turns)
    grid = req.model_inputs["image_grid_thw"]
    assert req.token_ids.count(core.info.image_token_id) == int(grid.prod(-1).sum()) // 4
