"""The preprocessor's private copy of a model's tokenizer / processor, with the sentinels registered."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preprocessor.processor_parts import load_processor_from_parts
from preprocessor.sentinel import MAX_EMBEDS_PARTS, Sentinels
from splice.errors import FailedPrecondition, InvalidArgument

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelFiles:
    path: str
    tokenizer: Any  # PreTrainedTokenizerBase; shared with `processor` when there is one
    processor: Any | None  # ProcessorMixin with an image processor, or None for text-only models
    chat_template: str | None  # the processor's template when it has one, else the tokenizer's
    # Registered on `tokenizer`: IDs >= base_vocab, but NOT necessarily >= the engine's vocab_rows (padded
    # embedding tables), so they never mark anything outside a rendered chat prompt.
    sentinels: Sentinels
    base_vocab: int  # len(tokenizer) before the sentinels were added
    image_placeholder: str | None  # the text the processor expands per image, e.g. "<image>"
    # Characters of the longest vocabulary entry (added tokens included): no token covers more characters of text
    # (a byte-level entry spells one byte per character), so text longer than max_model_len times this cannot fit.
    longest_token: int = 1

    def check_text(self, text: str, where: object, what: str = "text") -> None:
        """Caller strings that reach the rendered prompt may contain neither a sentinel (read as a prompt_embeds
        part) nor the image placeholder (read as an image slot)."""
        self.sentinels.check_text(text, where, what)
        if self.image_placeholder and self.image_placeholder in text:
            raise InvalidArgument(f"{where}: {what} contains the reserved string {self.image_placeholder!r} (the "
                                  f"image placeholder); send images as their own content parts")

    @property
    def accepts_images(self) -> bool:
        return self.processor is not None and getattr(self.processor, "image_processor", None) is not None


def load_processor(path: str | Path) -> Any:
    """The model's processor with PIL image processors: AutoProcessor, else built from its loadable parts."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path, local_files_only=True, backend="pil")
    except Exception as exc:  # e.g. a part needs torchvision: build the processor from the parts that load
        log.info("%s: AutoProcessor failed (%s: %s); building the processor from its loadable parts", path,
                 type(exc).__name__, exc)
        try:
            return load_processor_from_parts(path)
        except Exception:
            raise exc from None


def load_model_files(path: str | Path, max_embeds_parts: int = MAX_EMBEDS_PARTS) -> ModelFiles:
    """Loads (from local files only) the processor when the folder has one, else the tokenizer, and registers
    `max_embeds_parts` sentinels (requests with more prompt_embeds parts are refused)."""
    from transformers import AutoTokenizer

    path = str(path)
    processor = None
    has_processor = any((Path(path) / f).exists() for f in ("preprocessor_config.json", "processor_config.json"))
    try:
        if has_processor:
            # PIL image processors, as transformers 4 loaded them: the same pixels whether or not torchvision
            # is installed (transformers 5 would pick its torchvision ones when it is); built from its parts
            # when a sub-processor exists only for torchvision.
            processor = load_processor(path)
            if not hasattr(processor, "tokenizer"):  # a bare image processor: no use without a tokenizer
                processor = None
        tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(
            path, local_files_only=True)
    except Exception as exc:
        raise FailedPrecondition(f"cannot load the tokenizer/processor of {path}: {type(exc).__name__}: "
                                 f"{exc}") from exc
    base_vocab = len(tokenizer)
    longest = max(map(len, tokenizer.get_vocab()), default=1)  # (before the sentinels, which callers cannot send)
    sentinels = Sentinels.register(tokenizer, max_embeds_parts)
    template = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    placeholder = getattr(processor, "image_token", None) if processor is not None else None
    placeholder = str(placeholder) if placeholder is not None else None  # some processors keep an AddedToken
    log.info("loaded %s: %s, vocab %d, sentinels %d..%d", path, type(processor or tokenizer).__name__, base_vocab,
             sentinels.ids[0], sentinels.ids[-1])
    return ModelFiles(path, tokenizer, processor, template, sentinels, base_vocab, placeholder, longest)
