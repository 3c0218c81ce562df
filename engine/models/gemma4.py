"""Gemma 4 (Gemma4ForConditionalGeneration), E2B-style.

What it needs beyond the defaults, each as HF's Gemma4Model does it:
- per-layer inputs (PLE) looked up from the token IDs; positions without a text token of their own (image soft
  tokens, supplied prompt_embeds rows) and any multimodal token ID take the text pad ID, so they get the pad's
  per-layer input (and a generated multimodal token ID is embedded as the pad, as HF replaces it);
- sliding-window layers: one mask per layer type, the sliding one limited to `sliding_window` keys;
- KV-shared layers: the last layers reuse the keys/values of the last earlier layer of their type within the same
  forward and never write to the cache, so the cache holds only the producing layers, every one a full (not
  sliding) key/value layer here: the slot cache (slot_cache.py) serves it unchanged, the mask does the windowing;
- final logit softcapping;
- images of a variable number of soft tokens: patches padded to the processor's budget with position (-1, -1),
  pooled k x k into one row each. Text positions are plain 0..P-1 (images take no special position ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.models.base import (
    ImageGeometry,
    ModelFamily,
    StepInputs,
    check_float,
    check_names,
    feature_rows,
    first_dim_pieces,
)
from splice.errors import FailedPrecondition, InvalidArgument

IMAGE_INPUTS = ("pixel_values", "image_position_ids")


@dataclass(frozen=True)
class Gemma4Images(ImageGeometry):
    """pixel_values [images, patches, 3 * patch**2] with image_position_ids [images, patches, 2] (x, y; (-1, -1) is
    padding) -> one row per k x k block of each image's real patches, which must fill a grid of k-multiples."""

    patch_pixels: int  # 3 * patch_size**2
    pooling: int  # k: patches pooled per side into one soft token
    position_table: int  # x and y must stay below this (the vision tower's position embedding rows)

    @classmethod
    def from_config(cls, config: Any) -> Gemma4Images:
        vc = config.vision_config
        return cls(3 * vc.patch_size**2, vc.pooling_kernel_size, vc.position_embedding_size)

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        check_names(inputs, IMAGE_INPUTS, IMAGE_INPUTS)
        pv, pos = inputs["pixel_values"], inputs["image_position_ids"]
        block = self.pooling**2
        if pv.dim() != 3 or pv.shape[2] != self.patch_pixels or pv.shape[1] == 0 or pv.shape[1] % block:
            raise InvalidArgument(f"pixel_values: shape {list(pv.shape)}, expected [images, patches (a multiple of "
                                  f"{block}), {self.patch_pixels}]")
        check_float("pixel_values", pv)
        if pos.dtype.is_floating_point or pos.dtype == torch.bool or tuple(pos.shape) != (*pv.shape[:2], 2):
            raise InvalidArgument(f"image_position_ids: {pos.dtype} {list(pos.shape)}, expected integer "
                                  f"[{pv.shape[0]}, {pv.shape[1]}, 2] (pixel_values' images and patches)")
        return sum(self._rows(k, p) for k, p in enumerate(pos.long()))

    def _rows(self, k: int, pos: torch.Tensor) -> int:
        """pos [patches, 2] of image k -> its soft tokens; the grid checks keep HF's pooling well defined."""
        real = pos[~(pos == -1).all(-1)]  # [n, 2]
        n = len(real)
        where = f"image_position_ids[{k}]"
        if n == 0 or bool((real < 0).any()) or bool((real >= self.position_table).any()):
            raise InvalidArgument(f"{where}: {n} real patches, positions must be in [0, {self.position_table})")
        width, height = int(real[:, 0].max()) + 1, int(real[:, 1].max()) + 1
        distinct = len(torch.unique(real[:, 0] * height + real[:, 1]))
        if distinct != n or width * height != n or width % self.pooling or height % self.pooling:
            raise InvalidArgument(f"{where}: {n} real patches do not fill a {width}x{height} grid whose sides are "
                                  f"multiples of {self.pooling}")
        return n // self.pooling**2


class Gemma4(ModelFamily):
    name = "gemma4"
    packs_mixed_steps = False  # per-layer inputs and one mask per layer type

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        tc = self.text_config
        if getattr(tc, "use_bidirectional_attention", None) is not None:
            # Larger Gemma 4 models let image tokens attend bidirectionally (mm_token_type_ids): not built here.
            raise FailedPrecondition(f"gemma4 with use_bidirectional_attention={tc.use_bidirectional_attention!r} "
                                     "is not supported (E2B-style models, with None, are)")
        self.images = Gemma4Images.from_config(self.config) if self.config.vision_config is not None else None
        self.pad_id = int(tc.pad_token_id)
        ids = [getattr(self.config, a, None) for a in ("image_token_id", "video_token_id", "audio_token_id")]
        self.multimodal_ids = torch.tensor([i for i in ids if i is not None], dtype=torch.long, device=device)
        self.layer_types = set(tc.layer_types)
        self.window = tc.sliding_window
        self.softcap = tc.final_logit_softcapping
        self.per_layer = bool(tc.hidden_size_per_layer_input)

    def _text_ids(self, ids: torch.Tensor, fill: torch.Tensor | None = None) -> torch.Tensor:
        """ids with the pad ID wherever HF puts it: multimodal token IDs, and `fill` (image and span positions)."""
        fill = torch.isin(ids, self.multimodal_ids) if fill is None else fill | torch.isin(ids, self.multimodal_ids)
        return torch.where(fill, self.pad_id, ids)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(self._text_ids(ids)).to(self.dtype)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        pos = inputs["image_position_ids"].to(device=self.device, dtype=torch.long)
        return feature_rows(self.model.model.get_image_features(pv, pos))  # [soft tokens of all images, hidden]

    def image_pieces(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return first_dim_pieces(inputs)  # one per image (its patches padded to the processor's fixed budget)

    def attention_mask(self, step: StepInputs) -> dict[str, torch.Tensor | None]:
        q = step.token_ids.shape[1]
        masks = {"full_attention": self.causal_mask(step.mask, q)}
        if "sliding_attention" in self.layer_types:
            masks["sliding_attention"] = self.causal_mask(step.mask, q, self.window)
        return masks

    def forward_kwargs(self, step: StepInputs, embeds: torch.Tensor) -> dict[str, Any]:
        if not self.per_layer:
            return {}
        fill = None if step.image_mask is None else step.image_mask | step.span_mask
        ids = self._text_ids(step.token_ids, fill)  # [rows, q]
        return {"per_layer_inputs": self.backbone.get_per_layer_inputs(ids)}  # [rows, q, layers, per-layer size]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        if self.softcap is not None:  # in the model dtype and order, as HF's forward
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.float()
