"""Whether the ENGINE (its ModelInfo) and the preprocessor's model files serve a request's kinds of input.

The rules on the request's IDs, lengths, spans and tensors are shared with the engine: splice.request_rules.
"""

from __future__ import annotations

from splice.errors import FailedPrecondition
from splice.model_info import PROMPT_EMBEDS, ModelInfo


def check_images_supported(n_images: int, info: ModelInfo, processor_has_images: bool, first: object = "") -> None:
    """`first` names the first image part, for the message."""
    if n_images and not info.accepts_images:
        raise FailedPrecondition(f"{first}: image part, but the served model ({info.architecture}) does not accept "
                                 f"images ({n_images} in the request)")
    if n_images and not processor_has_images:
        raise FailedPrecondition("the request has images, but the preprocessor's model files have no image "
                                 "processor")


def check_embeds_supported(n_parts: int, info: ModelInfo) -> None:
    if n_parts and PROMPT_EMBEDS not in info.input_kinds:
        raise FailedPrecondition(f"the request has {n_parts} prompt_embeds part(s), but the served model does not "
                                 f"accept prompt embeddings")
