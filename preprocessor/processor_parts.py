"""A model's processor built from its parts, for processors transformers can only load with torchvision.

AutoProcessor(backend="pil") fails when a sub-processor exists only for torchvision: a video processor the
model has (Qwen3-VL / Qwen3.5's processor takes one, though Splice serves no video), or a torchvision-only image
processor (LFM2-VL). Then the processor class named by the folder is built from the tokenizer, the PIL image
processor (Splice's own substitute where transformers has none: preprocessor/pil_image_processors) and the chat
template, with the missing sub-processors left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from preprocessor.pil_image_processors import SUBSTITUTES


def load_processor(path: str) -> Any:
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path, local_files_only=True, backend="pil")
    except (ImportError, ValueError) as exc:  # a torchvision-only sub-processor
        try:
            return processor_from_parts(path)
        except Exception:
            raise exc from None


def without_missing_parts(cls: type) -> type:
    """`cls` accepting None for a sub-processor (ProcessorMixin type-checks every one, and the check itself
    needs torchvision for a video processor)."""

    class Partial(cls):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            return None if argument is None else super().check_argument_for_proper_class(argument_name, argument)

    Partial.__name__ = Partial.__qualname__ = cls.__name__
    return Partial


def saved_configs(folder: Path) -> tuple[dict, dict]:
    """(processor settings, image processor settings) as saved: transformers 5 nests the image processor's in
    processor_config.json, older folders keep them in preprocessor_config.json."""
    processor, image = {}, {}
    if (folder / "preprocessor_config.json").exists():
        image = json.loads((folder / "preprocessor_config.json").read_text())
    if (folder / "processor_config.json").exists():
        processor = json.loads((folder / "processor_config.json").read_text())
        image = processor.pop("image_processor", image)
    processor.setdefault("processor_class", image.get("processor_class"))
    return processor, image


def image_processor_from(path: str, saved: dict) -> Any:
    """The folder's image processor on PIL: Splice's substitute when transformers has only a torchvision one."""
    from transformers import AutoImageProcessor

    substitute = SUBSTITUTES.get(saved.get("image_processor_type", ""))
    if substitute is not None:
        return substitute.from_dict(saved)
    return AutoImageProcessor.from_pretrained(path, local_files_only=True, backend="pil")


def processor_from_parts(path: str) -> Any:
    import transformers
    from transformers import AutoTokenizer

    folder = Path(path)
    saved, image_saved = saved_configs(folder)
    cls = getattr(transformers, saved.get("processor_class") or "", None)
    if cls is None:
        raise ImportError(f"{path}: processor class {saved.get('processor_class')!r} is not a transformers class")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    template_file = folder / "chat_template.jinja"
    template = template_file.read_text() if template_file.exists() else getattr(tokenizer, "chat_template", None)
    parts = {name: None for name in cls.get_attributes()}
    parts.update(tokenizer=tokenizer, image_processor=image_processor_from(path, image_saved))
    return without_missing_parts(cls)(**parts, chat_template=template)


def save_processor_parts(processor: Any, out: Path) -> None:
    """What save_pretrained writes for `processor`, when one of its parts is missing (save_pretrained fails)."""
    processor.tokenizer.save_pretrained(out)
    processor.image_processor.save_pretrained(out)
    (out / "processor_config.json").write_text(json.dumps({"processor_class": type(processor).__name__}, indent=2)
                                               + "\n")
    if processor.chat_template:
        (out / "chat_template.jinja").write_text(processor.chat_template)
