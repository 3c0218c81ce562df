"""The preprocessor's private copy of a model's tokenizer / processor, with the sentinel registered."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preprocessor.sentinel import SENTINEL, register_sentinel
from splice.errors import FailedPrecondition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFiles:
    path: str
    tokenizer: Any  # PreTrainedTokenizerBase; shared with `processor` when there is one
    processor: Any | None  # ProcessorMixin with an image processor, or None for text-only models
    chat_template: str | None  # the processor's template when it has one, else the tokenizer's
    sentinel_id: int  # ID of SENTINEL; >= the model's own vocabulary size
    base_vocab: int  # len(tokenizer) before the sentinel was added
    image_placeholder: str | None  # the text the processor expands per image, e.g. "<image>"

    @property
    def forbidden_texts(self) -> tuple[str, ...]:
        """Strings user text may not contain: they would be read as a sentinel or an image slot."""
        return tuple(s for s in (SENTINEL, self.image_placeholder) if s)

    @property
    def accepts_images(self) -> bool:
        return self.processor is not None and getattr(self.processor, "image_processor", None) is not None


def load_model_files(path: str | Path) -> ModelFiles:
    """Loads (from local files only) the processor when the folder has one, else the tokenizer."""
    from transformers import AutoProcessor, AutoTokenizer

    path = str(path)
    processor = None
    has_processor = any((Path(path) / f).exists() for f in ("preprocessor_config.json", "processor_config.json"))
    try:
        if has_processor:
            processor = AutoProcessor.from_pretrained(path, local_files_only=True)
            if not hasattr(processor, "tokenizer"):  # a bare image processor: no use without a tokenizer
                processor = None
        tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(
            path, local_files_only=True)
    except Exception as exc:
        raise FailedPrecondition(f"cannot load the tokenizer/processor of {path}: {type(exc).__name__}: "
                                 f"{exc}") from exc
    base_vocab = len(tokenizer)
    sentinel_id = register_sentinel(tokenizer)
    template = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    placeholder = getattr(processor, "image_token", None) if processor is not None else None
    placeholder = str(placeholder) if placeholder is not None else None  # some processors keep an AddedToken
    log.info("loaded %s: %s, vocab %d, sentinel %d", path, type(processor or tokenizer).__name__, base_vocab,
             sentinel_id)
    return ModelFiles(path, tokenizer, processor, template, sentinel_id, base_vocab, placeholder)
