"""The normalized request the preprocessor hands the engine: plain data, no protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from splice.sampling import SamplingParams

PROMPT_EMBEDS = "prompt_embeds"
# Precomputed image features (vLLM's image_embeds): [rows, hidden] of every image of the request, in placeholder order,
# merged at the image-token positions instead of what the vision tower would make of pixels.
IMAGE_EMBEDS = "image_embeds"


@dataclass(frozen=True)
class EmbedSpan:
    offset: int  # first prompt position the rows replace
    length: int  # number of positions == rows of the tensor
    tensor_index: int  # index into EngineRequest.tensors


@dataclass(frozen=True)
class NamedTensor:
    name: str  # PROMPT_EMBEDS, IMAGE_EMBEDS, or the forward() keyword of a model input ("pixel_values", ...)
    tensor: torch.Tensor


@dataclass
class EngineRequest:
    request_id: str
    token_ids: list[int]  # [seq_len]; span positions hold a filler ID, image positions the image token
    embed_spans: list[EmbedSpan] = field(default_factory=list)
    tensors: list[NamedTensor] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    model_fingerprint: str = ""  # ModelInfo.fingerprint the request was validated against ("" = unchecked)
    # engine-side, never on the wire: the content keys of its image pieces (engine/encoder_cache.py), hashed beside
    # validation off the engine loop; None = hashed at the prompt's merge
    image_keys: list[str] | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.token_ids)

    def span_rows(self, span: EmbedSpan) -> torch.Tensor:
        """[span.length, hidden] rows of `span`."""
        return self.tensors[span.tensor_index].tensor

    @property
    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Tensors other than prompt embeddings, by forward() keyword (pixel_values, ...) or IMAGE_EMBEDS."""
        return {t.name: t.tensor for t in self.tensors if t.name != PROMPT_EMBEDS}
