"""Gemma 3 (Gemma3ForConditionalGeneration with a SigLIP tower; Gemma3ForCausalLM for the text-only sizes).

Each image is one run of `mm_tokens_per_image` soft tokens that see each other both ways at prefill (HF builds
this from `token_type_ids`; here the prompt's image mask says the same). Sliding-window layers sit beside
global ones, so the backbone gets one mask per layer type. Embedding rows are scaled by sqrt(hidden) inside
the embedding module, so the looked-up rows (what prompt_embeds must match) are the scaled ones.
"""

from __future__ import annotations

import torch

from engine.models.base import ModelFamily, Prompt, SquareImages, StepInputs, feature_rows, first_dim_pieces
from splice.errors import FailedPrecondition


def image_blocks(image_mask: torch.Tensor) -> torch.Tensor:
    """[rows, q] bool -> [rows, q] long: the index of the image run each position belongs to, -1 for text.
    A run is a maximal stretch of image positions (HF's get_block_sequence_ids_for_mask)."""
    before = torch.nn.functional.pad(image_mask, (1, 0))[:, :-1]
    starts = image_mask & ~before
    return torch.where(image_mask, starts.long().cumsum(1) - 1, -1)


class Gemma3(ModelFamily):
    name = "gemma3"
    packs_mixed_steps = False  # one mask per layer type (sliding windows) and images seen both ways
    images_both_ways = True

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        tc = self.text_config
        if getattr(tc, "use_bidirectional_attention", False):
            raise FailedPrecondition("gemma3 with use_bidirectional_attention (an encoder) does not generate")
        self.window: int | None = tc.sliding_window
        vision = getattr(self.config, "vision_config", None) is not None
        # HF caps the final logits in Gemma3ForCausalLM only; Gemma3ForConditionalGeneration ignores the setting.
        self.softcap: float | None = None if vision else tc.final_logit_softcapping
        if vision:
            # each image's patch grid average-pooled to mm_tokens_per_image soft tokens
            vc = self.config.vision_config
            self.images = SquareImages(vc.num_channels, vc.image_size, self.config.mm_tokens_per_image)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        return feature_rows(self.model.get_image_features(pixel_values=pv))  # [images * tokens_per_image, hidden]

    def image_pieces(self, inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        return first_dim_pieces(inputs)  # one per image (a pan-and-scan crop is an image)

    def attention_mask(self, step: StepInputs) -> dict[str, torch.Tensor | None]:
        """Causal, and causal within the window for sliding layers; at prefill, positions of one image also see
        that image's later positions (in sliding layers too: the window only limits how far back a query sees).
        Different images never see each other's future."""
        q = step.token_ids.shape[1]
        images = step.image_mask is not None and bool(step.image_mask.any())
        full = self.causal_mask(step.mask, q, dense=images)  # [rows, 1, q, T] bool, or None
        sliding = self.causal_mask(step.mask, q, window=self.window, dense=images)
        if images:
            width = step.mask.shape[1]
            blocks = image_blocks(step.image_mask)  # [rows, q]
            keys = torch.nn.functional.pad(blocks, (width - q, 0), value=-1)  # [rows, T]; cached columns are text
            same = (blocks[:, :, None] == keys[:, None, :]) & (blocks[:, :, None] >= 0)  # [rows, q, T]
            full.masked_fill_(same[:, None], True)
            if self.window is not None:
                key = torch.arange(width, device=step.mask.device)
                query = torch.arange(width - q, width, device=step.mask.device)
                same &= (key[None, :] > query[:, None] - self.window)[None]
            sliding.masked_fill_(same[:, None], True)
        return {"full_attention": full, "sliding_attention": sliding}

    def chunkable(self, prompt: Prompt) -> bool:
        """Not with images: each image run sees itself both ways at prefill, which a chunk boundary could cut."""
        return not bool(prompt.image_mask.any())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.head(hidden).float()
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out
