"""Checks of a normalized prompt against the ENGINE's bounds (ModelInfo), never the tokenizer's length."""

from __future__ import annotations

from collections.abc import Sequence

from splice.errors import FailedPrecondition, InvalidArgument
from splice.model_info import PROMPT_EMBEDS, ModelInfo


def check_ids(ids: Sequence[int], info: ModelInfo, what: str = "token ID") -> None:
    for pos, t in enumerate(ids):
        if not (0 <= t < info.vocab_rows):
            raise InvalidArgument(f"{what} {t} at position {pos} is out of range: the engine's embedding table has "
                                  f"{info.vocab_rows} rows (IDs must be in [0, {info.vocab_rows}))")


def check_length(n: int, info: ModelInfo) -> None:
    if n == 0:
        raise InvalidArgument("the prompt is empty")
    if n >= info.max_model_len:  # as the engine: at least one position must be left to generate into
        raise InvalidArgument(f"the prompt is {n} positions long; the engine's max_model_len is "
                              f"{info.max_model_len} and at least one position must be left to generate")


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
