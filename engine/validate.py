"""Re-validation of an EngineRequest against what this engine serves (docs/architecture.md, engine step 1).

The preprocessor checks the same rules (splice.request_rules); the engine checks again because it is the
one that would index out of bounds or merge the wrong rows. Only the image rule needs the model. Every
failure is InvalidArgument naming the part, expected vs got (FailedPrecondition for unsupported kinds).
"""

from __future__ import annotations

import torch

from engine.models.base import ImageGeometry, check_float, check_names
from splice.engine_request import IMAGE_EMBEDS, EngineRequest
from splice.errors import FailedPrecondition, InvalidArgument
from splice.model_info import ModelInfo
from splice.request_rules import check_request, check_values


def _supplied_rows(inputs: dict[str, torch.Tensor], info: ModelInfo, images: ImageGeometry) -> int:
    """Rows of precomputed image features [rows, hidden] (finite floats), which the tensors beside them agree with."""
    names = (IMAGE_EMBEDS, *images.beside_embeds)
    check_names(inputs, names, names)
    features = inputs[IMAGE_EMBEDS]
    if features.dim() != 2 or features.shape[1] != info.hidden_size:
        raise InvalidArgument(f"{IMAGE_EMBEDS}: shape {list(features.shape)}, expected [rows, {info.hidden_size}] "
                              f"(the hidden size)")
    check_float(IMAGE_EMBEDS, features)
    described = images.embeds_rows(inputs)
    if described is not None and described != features.shape[0]:
        raise InvalidArgument(f"{IMAGE_EMBEDS}: {features.shape[0]} rows, but {', '.join(names[1:])} describe "
                              f"{described}")
    return features.shape[0]


def _check_images(req: EngineRequest, info: ModelInfo, images: ImageGeometry | None, covered: set[int]) -> None:
    inputs = req.model_inputs
    image_positions = ([i for i, t in enumerate(req.token_ids) if t == info.image_token_id and i not in covered]
                       if info.image_token_id is not None else [])
    if images is None:
        if inputs:
            raise FailedPrecondition(f"{info.model} takes no image inputs; got tensors {sorted(inputs)}")
        return
    if IMAGE_EMBEDS in inputs:
        want = _supplied_rows(inputs, info, images)
    else:
        want = images.expected_rows(inputs) if inputs else 0
    if len(image_positions) != want:
        raise InvalidArgument(f"prompt has {len(image_positions)} image tokens (ID {info.image_token_id}) but the "
                              f"image inputs make {want} feature rows")


def validate_request(req: EngineRequest, info: ModelInfo, images: ImageGeometry | None) -> None:
    """`images`: the family's image geometry, None for a text-only model."""
    """Raises InvalidArgument (or FailedPrecondition for unsupported kinds) when `req` cannot be served."""
    covered = check_request(req, info)
    check_values(req)
    _check_images(req, info, images, covered)
