"""image_embeds parts in the preprocessor: off unless --enable-mm-embeds, never beside pictures, and every part checked
against its family's geometry before its rows are allocated, each refusal naming the part and what was expected."""

from __future__ import annotations

import base64
import io

import pytest
import torch

from preprocessor.content import Conversation, Embeds, ImageEmbeds, Message, Text, Where
from preprocessor.core import PreprocessorCore
from preprocessor.limits import Limits
from splice.engine_request import IMAGE_EMBEDS
from splice.errors import SpliceError
from tests.preprocessor.pp_factories import conversation, png_bytes, raw, rows

ON = Limits(enable_mm_embeds=True)
PART = "messages[0].content[0]"


def _b64(obj) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode()


def _core(tiny, name: str, limits: Limits = ON) -> PreprocessorCore:
    files, info = tiny[name]
    return PreprocessorCore(files, info, limits=limits)


def _qwen(tiny) -> tuple[PreprocessorCore, int, int]:
    """The Qwen2-VL core, the grid side used below and the rows a [1, side, side] grid makes."""
    core = _core(tiny, "tiny-qwen2-vl")
    merge = core.files.processor.image_processor.merge_size
    side = 2 * merge
    return core, side, side * side // merge**2


def _refused(core: PreprocessorCore, conv: Conversation, code: str = "INVALID_ARGUMENT") -> str:
    with pytest.raises(SpliceError) as exc:
        core.normalize_chat(conv)
    assert exc.value.code == code, exc.value.message
    return exc.value.message


def _chat(*parts) -> Conversation:
    return conversation(("user", [*parts, "What is shown?"]))


def test_off_unless_enabled_naming_the_part_and_the_flag(tiny):
    core, side, n = _qwen(tiny)
    part = {"image_embeds": rows(n, core.info.hidden_size), "image_grid_thw": [1, side, side]}
    message = _refused(_core(tiny, "tiny-qwen2-vl", Limits()), _chat(part), "FAILED_PRECONDITION")
    assert PART in message and "--enable-mm-embeds" in message
    assert core.normalize_chat(_chat(part)).request.model_inputs[IMAGE_EMBEDS].shape == (n, core.info.hidden_size)


def test_not_beside_pictures_nor_with_mm_processor_kwargs(tiny):
    core, side, n = _qwen(tiny)
    part = {"image_embeds": rows(n, core.info.hidden_size), "image_grid_thw": [1, side, side]}
    assert "mixing raw image and embedding inputs" in _refused(core, _chat(part, png_bytes()))
    conv = conversation(("user", [part, "Hi"]), mm_processor_kwargs={"max_pixels": 4096})
    assert "mm_processor_kwargs ['max_pixels'] apply to pictures" in _refused(core, conv)


def test_rows_must_be_what_the_geometry_makes(tiny):
    core, side, n = _qwen(tiny)
    hidden = core.info.hidden_size
    message = _refused(core, _chat({"image_embeds": rows(n + 1, hidden), "image_grid_thw": [1, side, side]}))
    assert message == (f"{PART}: image_embeds has {n + 1} rows; image_grid_thw [1, {side}, {side}] makes {n} image "
                       f"tokens")
    message = _refused(core, _chat({"image_embeds": rows(n, hidden), "image_grid_thw": [1, side, side + 1]}))
    assert f"{PART}: image_embeds image_grid_thw is [1, {side}, {side + 1}]; h and w must be multiples" in message
    # a grid far larger than the context is refused before the processor would write its tokens
    huge = _refused(core, _chat({"image_embeds": rows(n, hidden), "image_grid_thw": [1, 2**20, 2**20]}))
    assert f"making at most {core.info.max_model_len - 1} rows" in huge


def test_hidden_size_dtype_finiteness_and_size_cap(tiny):
    core, side, n = _qwen(tiny)
    hidden = core.info.hidden_size
    grid = {"image_grid_thw": [1, side, side]}
    assert f"has {hidden + 1} columns, expected hidden size {hidden}" in _refused(
        core, _chat({"image_embeds": rows(n, hidden + 1), **grid}))
    assert "image_embeds has dtype int64, expected a float dtype" in _refused(
        core, _chat({"image_embeds": torch.ones(n, hidden, dtype=torch.int64), **grid}))
    nan = rows(n, hidden)
    nan[1, 2] = float("nan")
    assert f"{PART}: image_embeds holds non-finite values" in _refused(core, _chat({"image_embeds": nan, **grid}))
    capped = PreprocessorCore(core.files, core.info, limits=Limits(enable_mm_embeds=True, max_embeds_bytes=64))
    assert f"{PART}: image_embeds of shape [{n}, {hidden}] is {n * hidden * 4} bytes; at most 64" in _refused(
        capped, _chat({"image_embeds": rows(n, hidden), **grid}))


def test_keys_the_family_reads_are_required_and_no_other(tiny):
    core, side, n = _qwen(tiny)
    hidden = core.info.hidden_size
    assert f"{PART}: image_embeds needs ['image_grid_thw']" in _refused(core, _chat({"image_embeds": rows(n, hidden)}))
    message = _refused(core, _chat({"image_embeds": rows(n, hidden), "image_grid_thw": [1, side, side],
                                    "image_sizes": [4, 4]}))
    assert f"{PART}: image_embeds keys ['image_sizes'] are not read for this model; it takes ['image_grid_thw']" \
        in message
    llava = _core(tiny, "tiny-llava")
    assert "it takes none (the rows settle the geometry)" in _refused(
        llava, _chat({"image_embeds": rows(4, llava.info.hidden_size), "image_sizes": [4, 4]}))


def test_geometry_as_a_torch_save_tensor_or_nested_list_and_rows_as_1_n_hidden(tiny):
    core, side, n = _qwen(tiny)
    features = rows(n, core.info.hidden_size)
    want = core.normalize_chat(_chat({"image_embeds": features, "image_grid_thw": [1, side, side]})).request
    where = Where(0, 0)
    for grid in (_b64(torch.tensor([[1, side, side]])), [[1, side, side]], (1, side, side)):
        for embeds in (Embeds("tensor", raw(features[None]), where, "image_embeds"),
                       Embeds("torch_base64", _b64(features), where, "image_embeds")):
            part = ImageEmbeds(embeds, {"image_grid_thw": grid}, where)
            conv = Conversation((Message("user", (part, Text("What is shown?", Where(0, 1))), False, 0),))
            got = core.normalize_chat(conv).request
            assert got.token_ids == want.token_ids
            assert torch.equal(got.model_inputs[IMAGE_EMBEDS], features)
            assert got.model_inputs["image_grid_thw"].tolist() == [[1, side, side]]
    bad = ImageEmbeds(Embeds("tensor", raw(features), where, "image_embeds"),
                      {"image_grid_thw": _b64(torch.tensor([1.0, side, side]))}, where)
    message = _refused(core, Conversation((Message("user", (bad,), False, 0),)))
    assert f"{PART}: image_embeds image_grid_thw has dtype float32; expected integers" in message


def test_an_idefics3_image_left_whole_needs_no_tiles_and_a_tiled_one_does(tiny):
    core = _core(tiny, "tiny-idefics3")
    whole = core.files.processor.image_seq_len
    hidden = core.info.hidden_size
    ids = core.normalize_chat(_chat({"image_embeds": rows(whole, hidden)})).request.token_ids
    assert sum(t == core.info.image_token_id for t in ids) == whole
    message = _refused(core, _chat({"image_embeds": rows(5 * whole, hidden)}))
    assert f"{PART}: image_embeds has {5 * whole} rows without rows and cols: an image left whole makes {whole}" \
        in message
    tiled = core.normalize_chat(_chat({"image_embeds": rows(5 * whole, hidden), "rows": 2, "cols": 2}),
                                count_images=True)
    assert tiled.image_token_counts == (5 * whole,)
    assert "expected one integer from 0 to" in _refused(core, _chat({"image_embeds": rows(5 * whole, hidden),
                                                                      "rows": 9, "cols": 1}))


def test_gemma3_rows_are_whole_views(tiny):
    core = _core(tiny, "tiny-gemma3")
    per = core.files.processor.image_seq_length
    message = _refused(core, _chat({"image_embeds": rows(per + 1, core.info.hidden_size)}))
    assert f"{PART}: image_embeds has {per + 1} rows; expected {per} per view" in message


def test_a_text_model_takes_no_image_embeds(tiny):
    core = _core(tiny, "tiny-text")
    message = _refused(core, _chat({"image_embeds": rows(4, core.info.hidden_size)}), "FAILED_PRECONDITION")
    assert f"{PART}: image part, but the served model" in message


async def test_the_http_face_answers_400s_naming_the_part(tiny_dirs, tiny):
    from tests.preprocessor.http_face import http_face

    files, info = tiny["tiny-qwen2-vl"]
    merge = files.processor.image_processor.merge_size
    features = _b64(rows(4, info.hidden_size))  # a [1, 2 merge, 2 merge] grid's rows

    def body(image_embeds) -> dict:
        content = [{"type": "image_embeds", "image_embeds": image_embeds}, {"type": "text", "text": "Hi"}]
        return {"messages": [{"role": "user", "content": content}], "max_tokens": 2}

    good = {"image_embeds": features, "image_grid_thw": [1, 2 * merge, 2 * merge]}
    async with http_face(tiny_dirs, tiny, "tiny-qwen2-vl") as off:
        resp = await off.http.post("/v1/chat/completions", json=body(good))
        assert resp.status_code == 400 and "--enable-mm-embeds" in resp.json()["error"]["message"], resp.text
    async with http_face(tiny_dirs, tiny, "tiny-qwen2-vl", limits=ON) as face:
        assert (await face.http.post("/v1/chat/completions", json=body(good))).status_code == 200
        for bad, message in ((None, "image_embeds is null"),
                             ({"image_grid_thw": [1, 2, 2]}, "holds the features as base64 under 'image_embeds'"),
                             ({**good, "image_grid_thw": [1, True, 4]}, "must hold integers"),
                             ({**good, "image_grid_thw": True}, "image_grid_thw")):
            resp = await face.http.post("/v1/chat/completions", json=body(bad))
            assert resp.status_code == 400 and message in resp.json()["error"]["message"], resp.text


def test_parts_that_fill_the_context_together_stop_decoding(tiny):
    import dataclasses

    core, side, n = _qwen(tiny)
    short = PreprocessorCore(core.files, dataclasses.replace(core.info, max_model_len=2 * n), limits=ON)
    part = {"image_embeds": rows(n, core.info.hidden_size), "image_grid_thw": [1, side, side]}
    message = _refused(short, _chat(part, part))
    assert message.startswith(f"messages[0].content[1]: the image_embeds up to this part has {2 * n} rows; the "
                              f"engine's max_model_len is {2 * n}")


@pytest.mark.parametrize("name", ["tiny-idefics3", "tiny-qwen2-vl"])
def test_beside_prompt_embeds_no_sentinel_reaches_the_engine(tiny, name):
    """On a model whose sentinels lie past its vocabulary (Idefics3) and one whose padded table covers them (Qwen2-VL):
    the spans are the prompt_embeds', the image tokens the image_embeds' rows, and no sentinel ID is left."""
    core = _core(tiny, name)
    files, info = core.files, core.info
    assert (min(files.sentinels.ids) >= info.vocab_rows) == (name == "tiny-idefics3")
    if name == "tiny-idefics3":
        n = files.processor.image_seq_len
        part = {"image_embeds": rows(n, info.hidden_size)}
    else:
        _, side, n = _qwen(tiny)
        part = {"image_embeds": rows(n, info.hidden_size), "image_grid_thw": [1, side, side]}
    soft = rows(3, info.hidden_size, seed=5)
    req = core.normalize_chat(conversation(("user", ["Look:", soft, part, "and", soft[:2], "What?"]))).request
    assert not set(req.token_ids) & files.sentinels.id_set and max(req.token_ids) < info.vocab_rows
    assert [s.length for s in req.embed_spans] == [3, 2]
    assert sum(t == info.image_token_id for t in req.token_ids) == n
    assert IMAGE_EMBEDS in req.model_inputs and "pixel_values" not in req.model_inputs


def test_the_flag_reaches_the_limits():
    import argparse

    from preprocessor.cli import add_arguments, limits_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert limits_from_args(parser.parse_args(["--enable-mm-embeds"])).enable_mm_embeds
    assert not limits_from_args(parser.parse_args([])).enable_mm_embeds
    from app.cli import build_parser

    assert build_parser().parse_args(["up", "--enable-mm-embeds"]).enable_mm_embeds  # passed on to the preprocessor
