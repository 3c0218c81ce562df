"""Two prompt_embeds spans of different lengths plus an image in one conversation (issue 3's core test)."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image as PILImage
from transformers import AutoTokenizer
from transformers.image_transforms import convert_to_rgb

from app.tiny import TINY_MODELS
from preprocessor.core import PreprocessorCore
from preprocessor.model_files import load_processor
from preprocessor.sentinel import FILLER_ID
from splice.engine_request import PROMPT_EMBEDS
from tests.preprocessor.pp_factories import conversation, png_bytes, rows


def _hf_ids(path, messages, images):
    """IDs HF itself produces for `messages` (no embeds parts), with a fresh processor/tokenizer."""
    if images:
        proc = load_processor(str(path))  # AutoProcessor(backend="pil"), or from its parts without torchvision
        text = proc.apply_chat_template(messages, add_generation_prompt=True)
        out = proc(text=text, images=images, return_tensors="pt")
        return out["input_ids"][0].tolist(), out
    tok = AutoTokenizer.from_pretrained(path)
    return tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"], None


def _without_spans(ids, spans):
    drop = {p for s in spans for p in range(s.offset, s.offset + s.length)}
    return [t for i, t in enumerate(ids) if i not in drop]


@pytest.mark.parametrize("name", ["tiny-text", "tiny-llava", "tiny-idefics3", "tiny-gemma4", "tiny-qwen2-vl",
                                  "tiny-qwen3.5", "tiny-lfm2-vl", "tiny-llava-onevision", "tiny-smolvlm",
                                  "tiny-nemotron-omni"])
def test_two_spans_and_an_image(tiny, tiny_dirs, name):
    files, info = tiny[name]
    with_image = name != "tiny-text"
    a, b = rows(3, info.hidden_size, seed=1), rows(5, info.hidden_size, seed=2)  # [3, hidden], [5, hidden]
    image = png_bytes(70, 45)
    user = ([image] if with_image else []) + ["Compare ", a, " with ", b, " please."]
    conv = conversation(("system", "Be brief."), ("user", user))
    core = PreprocessorCore(files, info)
    norm = core.normalize_chat(conv, count_images=True)
    req = norm.request

    # The sentinels overflow the vocabulary (no headroom) or land inside its padding (headroom) before
    # consumption, and never reach the engine.
    if TINY_MODELS[name].headroom:
        assert max(files.sentinels.ids[:2]) < info.vocab_rows
    else:
        assert min(files.sentinels.ids) >= info.vocab_rows
    assert not set(req.token_ids) & files.sentinels.id_set
    assert all(0 <= t < info.vocab_rows for t in req.token_ids)
    assert len(req.embed_spans) == 2
    s0, s1 = req.embed_spans
    assert (s0.length, s1.length) == (3, 5) and (s0.tensor_index, s1.tensor_index) == (0, 1)
    span_positions = [p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)]
    assert [i for i, t in enumerate(norm.raw_ids) if t in files.sentinels.id_set] == span_positions
    assert [norm.raw_ids[s.offset] for s in req.embed_spans] == list(files.sentinels.ids[:2])
    assert all(req.token_ids[p] == FILLER_ID for p in span_positions)

    # Text IDs equal HF's IDs for the same conversation without the embeds parts.
    hf_user = ([{"type": "image"}] if with_image else []) + [
        {"type": "text", "text": "Compare "}, {"type": "text", "text": " with "}, {"type": "text", "text": " please."}]
    messages = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": hf_user}]
    pil = [PILImage.open(io.BytesIO(image)).convert("RGB")] if with_image else []
    hf_ids, hf_out = _hf_ids(tiny_dirs[name], messages, pil)
    assert _without_spans(req.token_ids, req.embed_spans) == hf_ids

    # Spans sit exactly between the texts around them.
    tok = files.tokenizer
    assert tok.decode(req.token_ids[:s0.offset]).endswith("Compare ")
    assert tok.decode(req.token_ids[s0.offset + s0.length:s1.offset]) == " with "
    assert tok.decode(req.token_ids[s1.offset + s1.length:]).startswith(" please.")

    # Tensors: the rows as given (engine dtype), then the processor's own pixel tensors by name.
    assert [t.name for t in req.tensors[:2]] == [PROMPT_EMBEDS, PROMPT_EMBEDS]
    assert torch.equal(req.span_rows(s0), a) and torch.equal(req.span_rows(s1), b)
    if with_image:
        assert info.image_token_id in req.token_ids
        for key, value in req.model_inputs.items():
            assert torch.equal(value, hf_out[key]), key
        assert "pixel_values" in req.model_inputs
        assert sum(norm.image_token_counts) == req.token_ids.count(info.image_token_id)
    if name == "tiny-idefics3":
        assert "pixel_attention_mask" in req.model_inputs


def test_adjacent_embeds_parts_get_their_own_spans(tiny):
    files, info = tiny["tiny-text"]
    conv = conversation(("user", ["Look: ", rows(2, info.hidden_size), rows(4, info.hidden_size), "."]))
    req = PreprocessorCore(files, info).normalize_chat(conv).request
    (s0, s1) = req.embed_spans
    assert (s0.length, s1.length) == (2, 4) and s1.offset == s0.offset + 2


def test_batched_shape_and_dtype_cast(tiny):
    files, info = tiny["tiny-text"]
    from dataclasses import replace

    info16 = replace(info, dtype="bfloat16")
    x = rows(3, info.hidden_size).to(torch.float16)[None]  # [1, 3, hidden]
    req = PreprocessorCore(files, info16).normalize_chat(conversation(("user", ["a", x]))).request
    got = req.span_rows(req.embed_spans[0])
    assert got.shape == (3, info.hidden_size) and got.dtype == torch.bfloat16
    assert torch.equal(got, x[0].to(torch.bfloat16))


def test_multiple_images_counts(tiny):
    files, info = tiny["tiny-idefics3"]
    conv = conversation(("user", [png_bytes(70, 45), "and", png_bytes(30, 30, seed=3), "?"]))
    norm = PreprocessorCore(files, info).normalize_chat(conv, count_images=True)
    counts = norm.image_token_counts
    assert len(counts) == 2 and sum(counts) == norm.request.token_ids.count(info.image_token_id)
    # Independent of how the core counts: tiles (incl. the global view) x tokens per tile, from a fresh processor.
    proc = load_processor(files.path)
    for c, (w, h, seed) in zip(counts, [(70, 45, 0), (30, 30, 3)], strict=True):
        pic = PILImage.open(io.BytesIO(png_bytes(w, h, seed))).convert("RGB")
        tiles = proc.image_processor([pic], return_tensors="pt")["pixel_values"].shape[1]
        assert c == tiles * proc.image_seq_len


def _transparent_pictures() -> dict[str, bytes]:
    """A red square on a transparent background: RGBA, LA, a palette with a transparent index, RGB with a
    transparent colour."""
    rgba = PILImage.new("RGBA", (40, 30), (0, 0, 0, 0))
    rgba.paste((255, 0, 0, 255), (10, 8, 30, 22))
    la = PILImage.new("LA", (40, 30), (0, 0))
    la.paste((200, 255), (10, 8, 30, 22))
    palette = PILImage.new("P", (40, 30), 0)
    palette.putpalette([0, 0, 0, 255, 0, 0])  # index 0 black (transparent), 1 red
    palette.paste(1, (10, 8, 30, 22))
    palette.info["transparency"] = 0
    keyed = palette.convert("RGB")  # an RGB picture whose black is transparent (a tRNS chunk)
    out = {}
    for mode, pic in (("RGBA", rgba), ("LA", la), ("P", palette), ("RGB", keyed)):
        buf = io.BytesIO()
        keep = {"transparency": pic.info["transparency"]} if "transparency" in pic.info else {}
        pic.save(buf, format="PNG", **keep)
        out[mode] = buf.getvalue()
    return out


@pytest.mark.parametrize("name", ["tiny-llava", "tiny-idefics3", "tiny-gemma4", "tiny-qwen2-vl", "tiny-qwen3.5",
                                  "tiny-lfm2-vl", "tiny-llava-onevision", "tiny-smolvlm", "tiny-nemotron-omni"])
def test_transparent_pictures_are_painted_on_white_as_hf_does(tiny, tiny_dirs, name):
    files, info = tiny[name]
    core = PreprocessorCore(files, info)
    proc = load_processor(str(tiny_dirs[name]))
    for mode, blob in _transparent_pictures().items():
        raw = PILImage.open(io.BytesIO(blob))
        assert raw.mode == mode and raw.has_transparency_data
        req = core.normalize_chat(conversation(("user", [blob, "What colour?"])), count_images=True).request
        # HF gets the picture as decoded, transparency included: its processor converts it itself. Where HF
        # has only a torchvision processor (Splice's PIL port stands in), its do_convert_rgb step is applied here.
        ported = type(proc.image_processor).__module__.startswith("preprocessor.")
        given = PILImage.fromarray(convert_to_rgb(raw, return_numpy=True)) if ported else raw
        hf_out = proc.image_processor([given], return_tensors="pt")
        for key, value in hf_out.items():
            if key in req.model_inputs:
                assert torch.equal(req.model_inputs[key], value), (mode, key)
        # A black background (what convert("RGB") keeps) would be a different picture.
        dark = raw.convert("RGB")
        dark.info.pop("transparency", None)
        dark = proc.image_processor([dark], return_tensors="pt")["pixel_values"]
        assert not torch.equal(req.model_inputs["pixel_values"], dark), mode
