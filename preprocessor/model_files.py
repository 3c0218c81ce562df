"""The preprocessor's private copy of a model's tokenizer / processor, with the sentinels registered."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from preprocessor.limits import MAX_EMBEDS_PARTS
from preprocessor.sentinel import SENTINEL_PREFIX, register_sentinels
from splice.errors import FailedPrecondition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFiles:
    path: str
    tokenizer: Any  # PreTrainedTokenizerBase; shared with `processor` when there is one
    processor: Any | None  # ProcessorMixin with an image processor, or None for text-only models
    chat_template: str | None  # the processor's template when it has one, else the tokenizer's
    # IDs of sentinel_text(0), sentinel_text(1), ...: >= base_vocab, but NOT necessarily >= the engine's
    # vocab_rows (padded embedding tables), so they never mark anything outside a rendered chat prompt.
    sentinel_ids: tuple[int, ...]
    base_vocab: int  # len(tokenizer) before the sentinels were added
    image_placeholder: str | None  # the text the processor expands per image, e.g. "<image>"

    @property
    def forbidden_texts(self) -> tuple[str, ...]:
        """Strings user text may not contain: they would be read as a sentinel or an image slot."""
        return tuple(s for s in (SENTINEL_PREFIX, self.image_placeholder) if s)

    @cached_property
    def sentinel_id_set(self) -> frozenset[int]:
        """For detokenization, which drops these IDs."""
        return frozenset(self.sentinel_ids)

    @property
    def accepts_images(self) -> bool:
        return self.processor is not None and getattr(self.processor, "image_processor", None) is not None


def load_model_files(path: str | Path, max_embeds_parts: int = MAX_EMBEDS_PARTS) -> ModelFiles:
    """Loads (from local files only) the processor when the folder has one, else the tokenizer, and registers
    `max_embeds_parts` sentinels (requests with more prompt_embeds parts are refused)."""
    from transformers import AutoProcessor, AutoTokenizer

    if max_embeds_parts < 1:
        raise ValueError(f"max_embeds_parts must be >= 1, got {max_embeds_parts}")
    path = str(path)
    processor = None
    has_processor = any((Path(path) / f).exists() for f in ("preprocessor_config.json", "processor_config.json"))
    try:
        if has_processor:
            # PIL image processors, as transformers 4 loaded them: the same pixels whether or not torchvision
            # is installed (transformers 5 would pick its torchvision ones when it is).
            processor = AutoProcessor.from_pretrained(path, local_files_only=True, backend="pil")
            if not hasattr(processor, "tokenizer"):  # a bare image processor: no use without a tokenizer
                processor = None
        tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(
            path, local_files_only=True)
    except Exception as exc:
        raise FailedPrecondition(f"cannot load the tokenizer/processor of {path}: {type(exc).__name__}: "
                                 f"{exc}") from exc
    base_vocab = len(tokenizer)
    sentinel_ids = register_sentinels(tokenizer, max_embeds_parts)
    template = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    placeholder = getattr(processor, "image_token", None) if processor is not None else None
    placeholder = str(placeholder) if placeholder is not None else None  # some processors keep an AddedToken
    log.info("loaded %s: %s, vocab %d, sentinels %d..%d", path, type(processor or tokenizer).__name__, base_vocab,
             sentinel_ids[0], sentinel_ids[-1])
    return ModelFiles(path, tokenizer, processor, template, sentinel_ids, base_vocab, placeholder)
