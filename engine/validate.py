"""Re-validation of an EngineRequest against what this engine serves (DESIGN.md engine step 1).

The preprocessor checks the same rules; the engine checks again because it is the one that would index
out of bounds or merge the wrong rows. Every failure is InvalidArgument naming the part, expected vs got.
"""

from __future__ import annotations

import itertools

import torch

from engine.vision import VisionFamily
from splice.engine_request import PROMPT_EMBEDS, EngineRequest
from splice.errors import FailedPrecondition, InvalidArgument
from splice.model_info import ModelInfo
from splice.tensors import FLOAT_DTYPES


def _check_ids(req: EngineRequest, info: ModelInfo) -> None:
    if not req.token_ids:
        raise InvalidArgument("token_ids is empty")
    if req.prompt_len >= info.max_model_len:
        raise InvalidArgument(f"prompt has {req.prompt_len} positions; max_model_len is {info.max_model_len} "
                              "and at least one must be left to generate")
    for i, t in enumerate(req.token_ids):
        if not (0 <= t < info.vocab_rows):
            raise InvalidArgument(f"token_ids[{i}] = {t} is outside [0, {info.vocab_rows}) (the embedding rows)")


def _check_spans(req: EngineRequest, info: ModelInfo) -> set[int]:
    """Validates every span; returns the prompt positions they cover."""
    used_tensors: set[int] = set()
    ends: list[tuple[int, int, int]] = []
    for i, span in enumerate(req.embed_spans):
        what = f"embed_spans[{i}] (offset {span.offset}, length {span.length})"
        if span.length < 1:
            raise InvalidArgument(f"{what}: length must be >= 1")
        if span.offset < 0 or span.offset + span.length > req.prompt_len:
            raise InvalidArgument(f"{what}: ends at {span.offset + span.length}, past the prompt's "
                                  f"{req.prompt_len} positions")
        if not (0 <= span.tensor_index < len(req.tensors)):
            raise InvalidArgument(f"{what}: tensor_index {span.tensor_index} but {len(req.tensors)} tensors sent")
        named = req.tensors[span.tensor_index]
        if named.name != PROMPT_EMBEDS:
            raise InvalidArgument(f"{what}: tensors[{span.tensor_index}] is {named.name!r}, not {PROMPT_EMBEDS!r}")
        if span.tensor_index in used_tensors:
            raise InvalidArgument(f"{what}: tensors[{span.tensor_index}] is already used by another span")
        used_tensors.add(span.tensor_index)
        t = named.tensor
        if t.dim() != 2:
            raise InvalidArgument(f"{what}: tensors[{span.tensor_index}] has shape {list(t.shape)}, "
                                  f"expected [{span.length}, {info.hidden_size}]")
        if t.shape[0] != span.length:
            raise InvalidArgument(f"{what}: tensors[{span.tensor_index}] has {t.shape[0]} rows, expected {span.length}")
        if t.shape[1] != info.hidden_size:
            raise InvalidArgument(f"{what}: tensors[{span.tensor_index}] has {t.shape[1]} columns, expected "
                                  f"hidden size {info.hidden_size}")
        if t.dtype not in FLOAT_DTYPES:
            raise InvalidArgument(f"{what}: tensors[{span.tensor_index}] has dtype {t.dtype}, expected a float dtype")
        if not bool(torch.isfinite(t).all()):
            raise InvalidArgument(f"{what}: tensors[{span.tensor_index}] holds non-finite values (NaN or Inf)")
        ends.append((span.offset, span.offset + span.length, i))
    ends.sort()
    for (_, end_a, a), (start_b, _, b) in itertools.pairwise(ends):
        if start_b < end_a:
            raise InvalidArgument(f"embed_spans[{a}] and embed_spans[{b}] overlap at position {start_b}")
    for i, named in enumerate(req.tensors):
        if named.name == PROMPT_EMBEDS and i not in used_tensors:
            raise InvalidArgument(f"tensors[{i}] ({PROMPT_EMBEDS}) is referenced by no embed span")
    return {p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)}


def _check_images(req: EngineRequest, info: ModelInfo, vision: VisionFamily | None, covered: set[int]) -> None:
    inputs = req.model_inputs
    image_positions = ([i for i, t in enumerate(req.token_ids) if t == info.image_token_id and i not in covered]
                       if info.image_token_id is not None else [])
    if vision is None:
        if inputs:
            raise FailedPrecondition(f"{info.model} takes no image inputs; got tensors {sorted(inputs)}")
        return
    want = vision.expected_rows(inputs) if inputs else 0
    if len(image_positions) != want:
        raise InvalidArgument(f"prompt has {len(image_positions)} image tokens (ID {info.image_token_id}) but the "
                              f"image inputs make {want} feature rows")


def validate_request(req: EngineRequest, info: ModelInfo, vision: VisionFamily | None) -> None:
    """Raises InvalidArgument (or FailedPrecondition for unsupported kinds) when `req` cannot be served."""
    _check_ids(req, info)
    covered = _check_spans(req, info)
    _check_images(req, info, vision, covered)
