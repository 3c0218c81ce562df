"""Vision families: which image inputs a model takes, how many feature rows they make, and the features.

One class per family. `expected_rows` is checked against the image-token count before any forward
runs; `features` runs the vision tower + projector and returns rows in image-token order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splice.errors import FailedPrecondition, InvalidArgument
from splice.request_rules import check_finite, check_float_dtype


def _check_float(name: str, t: torch.Tensor) -> None:
    check_float_dtype(t.dtype, name)
    check_finite(t, name)


def _feature_rows(out) -> torch.Tensor:
    """get_image_features' answer -> [rows, hidden]. transformers 5 wraps the projected features in a
    BaseModelOutputWithPooling's pooler_output, as one tensor or one tensor per image."""
    feats = out.pooler_output
    if isinstance(feats, (list, tuple)):
        feats = torch.cat([f.reshape(-1, f.shape[-1]) for f in feats])
    return feats.reshape(-1, feats.shape[-1])


def _check_names(inputs: dict[str, torch.Tensor], accepted: tuple[str, ...], required: str) -> None:
    for name in inputs:
        if name not in accepted:
            raise InvalidArgument(f"tensor {name!r} is not an input of this model; expected one of {list(accepted)}")
    if required not in inputs:
        raise InvalidArgument(f"image inputs without {required!r}; got {sorted(inputs)}")


@dataclass(frozen=True)
class LlavaVision:
    """LLaVA: one image -> one contiguous run of image tokens (patches, minus CLS for "default")."""

    channels: int
    image_size: int
    patch_size: int
    select_strategy: str  # "default" drops the CLS position, "full" keeps it
    family = "llava"

    @property
    def rows_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + (1 if self.select_strategy == "full" else 0)

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        _check_names(inputs, ("pixel_values",), "pixel_values")
        pv = inputs["pixel_values"]  # [images, channels, height, width]
        want = (self.channels, self.image_size, self.image_size)
        if pv.dim() != 4 or tuple(pv.shape[1:]) != want:
            raise InvalidArgument(
                f"pixel_values: shape {list(pv.shape)}, expected [images, {', '.join(map(str, want))}]")
        _check_float("pixel_values", pv)
        return pv.shape[0] * self.rows_per_image

    def features(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=device, dtype=dtype)
        return _feature_rows(model.get_image_features(pixel_values=pv))  # [images * rows_per_image, hidden]


@dataclass(frozen=True)
class Idefics3Vision:
    """Idefics3 / SmolVLM: images split into tiles (+ a global view); each tile's rows sit between tags.

    All-zero tiles are batch padding and make no rows, exactly as the HF model drops them.
    """

    channels: int
    image_size: int
    patch_size: int
    scale_factor: int
    family = "idefics3"

    @property
    def rows_per_tile(self) -> int:
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor**2

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        _check_names(inputs, ("pixel_values", "pixel_attention_mask"), "pixel_values")
        pv = inputs["pixel_values"]  # [batch, tiles, channels, height, width]
        want = (self.channels, self.image_size, self.image_size)
        if pv.dim() != 5 or tuple(pv.shape[2:]) != want:
            raise InvalidArgument(
                f"pixel_values: shape {list(pv.shape)}, expected [batch, tiles, {', '.join(map(str, want))}]")
        _check_float("pixel_values", pv)
        mask = inputs.get("pixel_attention_mask")
        if mask is not None and tuple(mask.shape) != (*pv.shape[:2], *pv.shape[3:]):
            raise InvalidArgument(f"pixel_attention_mask: shape {list(mask.shape)}, expected "
                                  f"{[*pv.shape[:2], *pv.shape[3:]]} (pixel_values without channels)")
        real_tiles = int((pv.flatten(2) != 0).any(dim=-1).sum())
        return real_tiles * self.rows_per_tile

    def features(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=device, dtype=dtype)
        mask = inputs.get("pixel_attention_mask")
        if mask is not None:
            mask = mask.to(device=device, dtype=torch.bool)
        out = model.model.get_image_features(pixel_values=pv, pixel_attention_mask=mask)
        return _feature_rows(out)  # [real_tiles * rows_per_tile, hidden]


VisionFamily = LlavaVision | Idefics3Vision


def vision_family(config) -> VisionFamily | None:
    """The family of a loaded HF config; None for a text-only model."""
    model_type = getattr(config, "model_type", "")
    vc = getattr(config, "vision_config", None)
    if model_type == "llava":
        layer = config.vision_feature_layer
        if not isinstance(layer, int):
            raise FailedPrecondition("llava with several vision_feature_layer values is not supported")
        return LlavaVision(vc.num_channels, vc.image_size, vc.patch_size, config.vision_feature_select_strategy)
    if model_type in ("idefics3", "smolvlm"):
        return Idefics3Vision(vc.num_channels, vc.image_size, vc.patch_size, config.scale_factor)
    if vc is not None:
        raise FailedPrecondition(f"vision model type {model_type!r} is not supported yet (llava, idefics3, smolvlm)")
    return None
