"""Qwen3.5 (Qwen3_5ForConditionalGeneration): Qwen2-VL's images and M-RoPE positions (engine/models/qwen2_vl.py)
on a hybrid decoder, gated delta-net linear-attention layers between full attention layers: their state rows
join and leave through engine/models/hybrid_cache.py, and they take the 2-D padding mask, so left padding
never enters a state.
"""

from __future__ import annotations

import torch

from engine.models.base import StepInputs, feature_rows
from engine.models.hybrid_cache import HybridCache, recurrent_mask
from engine.models.qwen2_vl import Qwen2VL


class Qwen3_5(Qwen2VL):
    name = "qwen3_5"
    packs_mixed_steps = False  # linear-attention states beside attention

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.cache = HybridCache(self.text_config)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        grid = inputs["image_grid_thw"].to(device=self.device, dtype=torch.long)
        return feature_rows(self.model.model.get_image_features(pixel_values=pv, image_grid_thw=grid))

    def attention_mask(self, step: StepInputs) -> dict[str, torch.Tensor | None]:
        return {"full_attention": self.causal_mask(step.mask, step.token_ids.shape[1]),
                "linear_attention": recurrent_mask(step)}
