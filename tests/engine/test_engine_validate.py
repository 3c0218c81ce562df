"""Re-validation from hand-built requests (no model): every rule, its error type and message."""

from __future__ import annotations

import pytest
import torch

from engine.models.base import SquareImages
from engine.models.idefics3 import Idefics3Images
from engine.validate import validate_request
from splice.engine_request import PROMPT_EMBEDS, EmbedSpan, EngineRequest, NamedTensor
from splice.errors import FailedPrecondition, InvalidArgument
from splice.model_info import IMAGE, TEXT, ModelInfo
from splice.model_info import PROMPT_EMBEDS as KIND_EMBEDS

H = 8
IMG = 5
TEXT_INFO = ModelInfo("t", "LlamaForCausalLM", vocab_rows=100, hidden_size=H, dtype="float32", max_model_len=64)
VLM_INFO = ModelInfo("v", "X", vocab_rows=100, hidden_size=H, dtype="float32", max_model_len=256,
                     image_token_id=IMG, input_kinds=(TEXT, KIND_EMBEDS, IMAGE))
LLAVA = SquareImages(channels=3, image_size=16, rows_per_image=4)  # LLaVA's 8 px patches, CLS dropped
IDEFICS3 = Idefics3Images(channels=3, image_size=16, patch_size=4, scale_factor=2)  # 4 rows per tile


def embeds_request(ids, spans, tensors) -> EngineRequest:
    return EngineRequest("r", ids, [EmbedSpan(*s) for s in spans], [NamedTensor(PROMPT_EMBEDS, t) for t in tensors])


def rows(n: int, cols: int = H) -> torch.Tensor:
    return torch.randn(n, cols)


def test_a_well_formed_mixed_request_passes():
    req = embeds_request([1, 0, 0, 2, 0, 3], [(1, 2, 0), (4, 1, 1)], [rows(2), rows(1)])
    validate_request(req, TEXT_INFO, None)


@pytest.mark.parametrize(("ids", "match"), [
    ([1, 100, 2], r"token_ids: token ID 100 \(index 1\) is out of range: .* \[0, 100\)"),
    ([-1], r"token_ids: token ID -1 \(index 0\)"),
    ([], "empty"),
    ([1] * 64, "max_model_len is 64"),
])
def test_bad_ids(ids, match):
    with pytest.raises(InvalidArgument, match=match):
        validate_request(EngineRequest("r", ids), TEXT_INFO, None)


@pytest.mark.parametrize(("spans", "tensors", "match"), [
    ([(3, 3, 0)], [rows(3)], r"embed_spans\[0\] \(offset 3, length 3\): ends at 6, past the prompt's 5"),
    ([(0, 3, 0), (2, 2, 1)], [rows(3), rows(2)], r"embed_spans\[0\] and embed_spans\[1\] overlap at position 2"),
    ([(0, 2, 0)], [rows(3)], "has 3 rows, expected 2"),
    ([(0, 2, 0)], [rows(2, H + 1)], f"has {H + 1} columns, expected hidden size {H}"),
    ([(0, 2, 0)], [rows(2)[None]], r"shape \[1, 2, 8\], expected \[2, 8\]"),
    ([(0, 2, 1)], [rows(2)], "tensor_index 1 but 1 tensors sent"),
    ([(0, 1, 0), (2, 1, 0)], [rows(1)], "already used by another span"),
    ([(0, 2, 0)], [rows(2), rows(1)], r"tensors\[1\] \(prompt_embeds\) is referenced by no embed span"),
    ([(0, 0, 0)], [rows(0)], "length must be >= 1"),
    ([(0, 2, 0)], [torch.ones(2, H, dtype=torch.int64)], "expected a float dtype"),
    ([(0, 2, 0)], [torch.tensor([[float("nan")] * H, [0.0] * H])], "non-finite"),
    ([(0, 2, 0)], [torch.tensor([[float("inf")] * H, [0.0] * H])], "non-finite"),
])
def test_bad_spans(spans, tensors, match):
    with pytest.raises(InvalidArgument, match=match):
        validate_request(embeds_request([0, 0, 1, 2, 3], spans, tensors), TEXT_INFO, None)


def llava_request(n_image_tokens: int, images: int = 1, **extra) -> EngineRequest:
    ids = [1, 2] + [IMG] * n_image_tokens + [3]
    tensors = [NamedTensor("pixel_values", torch.randn(images, 3, 16, 16))]
    tensors += [NamedTensor(k, v) for k, v in extra.items()]
    return EngineRequest("r", ids, tensors=tensors)


def test_llava_image_tokens_must_equal_feature_rows():
    validate_request(llava_request(4), VLM_INFO, LLAVA)
    validate_request(llava_request(8, images=2), VLM_INFO, LLAVA)
    with pytest.raises(InvalidArgument, match=r"prompt has 3 image tokens \(ID 5\) but the image inputs make 4"):
        validate_request(llava_request(3), VLM_INFO, LLAVA)
    with pytest.raises(InvalidArgument, match=r"prompt has 2 image tokens .* make 0"):
        validate_request(EngineRequest("r", [IMG, IMG, 1]), VLM_INFO, LLAVA)


def test_llava_pixel_shape_values_and_names():
    bad_shape = EngineRequest("r", [IMG] * 4, tensors=[NamedTensor("pixel_values", torch.randn(1, 3, 16, 8))])
    with pytest.raises(InvalidArgument, match=r"pixel_values: shape \[1, 3, 16, 8\], expected \[images, 3, 16, 16\]"):
        validate_request(bad_shape, VLM_INFO, LLAVA)
    nan = torch.randn(1, 3, 16, 16)
    nan[0, 0, 0, 0] = float("nan")
    with pytest.raises(InvalidArgument, match="pixel_values holds non-finite"):
        validate_request(EngineRequest("r", [IMG] * 4, tensors=[NamedTensor("pixel_values", nan)]), VLM_INFO, LLAVA)
    with pytest.raises(InvalidArgument, match="'image_grid_thw' is not an input of this model"):
        validate_request(llava_request(4, image_grid_thw=torch.ones(1, 3)), VLM_INFO, LLAVA)


def test_images_on_a_text_model_are_a_failed_precondition():
    req = EngineRequest("r", [1, 2], tensors=[NamedTensor("pixel_values", torch.randn(1, 3, 16, 16))])
    with pytest.raises(FailedPrecondition, match="takes no image inputs"):
        validate_request(req, TEXT_INFO, None)


def test_idefics3_counts_real_tiles_only_and_scattered_tokens():
    pv = torch.randn(1, 3, 3, 16, 16)
    pv[0, 2] = 0  # batch padding tile: no rows
    mask = torch.ones(1, 3, 16, 16, dtype=torch.bool)
    ids = [1] + [IMG] * 4 + [7] + [IMG] * 4 + [8, 2]  # two tiles' rows split by a tag token
    req = EngineRequest("r", ids, tensors=[NamedTensor("pixel_values", pv), NamedTensor("pixel_attention_mask", mask)])
    validate_request(req, VLM_INFO, IDEFICS3)
    req.token_ids.append(IMG)
    with pytest.raises(InvalidArgument, match=r"prompt has 9 image tokens .* make 8 feature rows"):
        validate_request(req, VLM_INFO, IDEFICS3)
    bad_mask = [NamedTensor("pixel_values", pv), NamedTensor("pixel_attention_mask", mask[:, :2])]
    with pytest.raises(InvalidArgument, match="pixel_attention_mask: shape"):
        validate_request(EngineRequest("r", ids, tensors=bad_mask), VLM_INFO, IDEFICS3)


def test_image_token_ids_under_a_span_are_filler_not_images():
    # a span may cover a position holding the image token ID; it is replaced, so it is not an image position
    req = embeds_request([1, IMG, 2], [(1, 1, 0)], [rows(1)])
    validate_request(req, VLM_INFO, LLAVA)
