"""A model's processor built from the parts that can be built without torchvision.

transformers 5 processors of several families take a sub-processor that needs torchvision, which Splice never
requires: a video processor (Gemma 4, Qwen2-VL, Qwen3.5, ...), or an image processor that exists only for
torchvision (LFM2-VL; preprocessor/pil_image_processors holds Splice's PIL substitutes). AutoProcessor cannot
load those here. Chats with images need only the tokenizer and a PIL image processor: this builds the model's
own processor class with its loadable parts, every other part left out (None). Its text and image handling is
the processor's own code, unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from preprocessor.pil_image_processors import substitute_for

# The parts a chat with images cannot do without; any other part may be left out.
REQUIRED = ("tokenizer", "image_processor")


class NoVideoProcessor(dict):
    """Where a left-out video processor would be: some processors (SmolVLM) read its sampling defaults in
    apply_chat_template even for a chat without videos; processing a video is refused. A dict (an empty one),
    so that the processor's JSON form (its repr) still serializes."""

    num_frames = None
    fps = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("videos need a video processor, which needs torchvision")


def without_missing_parts(cls: type) -> type:
    """`cls` accepting None for a part (its type is checked only when the part is there)."""

    def check_argument_for_proper_class(self: Any, name: str, arg: Any) -> Any:
        return None if arg is None else cls.check_argument_for_proper_class(self, name, arg)

    return type(cls.__name__, (cls,), {"check_argument_for_proper_class": check_argument_for_proper_class})


def save_without_missing_parts(processor: Any, out: Path) -> None:
    """processor.save_pretrained for a processor with parts left out (save_pretrained needs every part): the
    tokenizer in its own files, the other parts' settings inside processor_config.json, the template beside."""
    processor.tokenizer._set_processor_class(type(processor).__name__)
    processor.tokenizer.save_pretrained(out)
    if isinstance(processor.chat_template, str):
        (out / "chat_template.jinja").write_text(processor.chat_template)
    processor.to_json_file(out / "processor_config.json")


def processor_class(path: str | Path) -> type | None:
    """The processor class a folder names (processor_config.json, preprocessor_config.json, tokenizer_config.json),
    else its model type's, as AutoProcessor resolves it."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES, processor_class_from_name

    for file in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json", "config.json"):
        f = Path(path) / file
        if f.exists():
            found = json.loads(f.read_text())
            name = found.get("processor_class") or PROCESSOR_MAPPING_NAMES.get(found.get("model_type", ""))
            if name:
                return processor_class_from_name(name)
    return None


def _saved_image_settings(folder: Path) -> dict:
    """The image processor's saved settings: transformers 5 nests them in processor_config.json, older folders
    keep them in preprocessor_config.json."""
    settings: dict = {}
    if (folder / "preprocessor_config.json").exists():
        settings = json.loads((folder / "preprocessor_config.json").read_text())
    if (folder / "processor_config.json").exists():
        settings = json.loads((folder / "processor_config.json").read_text()).get("image_processor", settings)
    return settings


def _image_processor(path: str) -> Any:
    """The folder's image processor on PIL: Splice's substitute when transformers has only a torchvision one."""
    from transformers import AutoImageProcessor

    saved = _saved_image_settings(Path(path))
    substitute = substitute_for(saved.get("image_processor_type", ""))
    if substitute is not None:
        return substitute.from_dict(saved)
    return AutoImageProcessor.from_pretrained(path, local_files_only=True, backend="pil")


def _part(name: str, path: str) -> Any:
    from transformers.processing_utils import MODALITY_TO_AUTOPROCESSOR_MAPPING

    if name == "image_processor":
        return _image_processor(path)
    # .keys(): the lazy mapping is an empty dict underneath, only keys() lists its modalities
    modality = next(m for m in MODALITY_TO_AUTOPROCESSOR_MAPPING.keys() if m in name)  # noqa: SIM118
    auto = MODALITY_TO_AUTOPROCESSOR_MAPPING[modality]
    if modality in REQUIRED:
        return auto.from_pretrained(path, local_files_only=True)
    try:
        return auto.from_pretrained(path, local_files_only=True)
    except (ImportError, OSError, ValueError):  # needs a missing backend (torchvision), or the folder has none
        return None


def load_processor_from_parts(path: str | Path) -> Any:
    """The folder's processor class, from its loadable parts and its saved settings."""
    path = str(path)
    found = processor_class(path)
    if found is None:
        raise ValueError(f"{path}: no processor class named in its files")
    cls = without_missing_parts(found)
    settings, init_kwargs = cls.get_processor_dict(path, local_files_only=True)
    parts = [_part(attr, path) for attr in cls.get_attributes()]
    processor = cls.from_args_and_dict(parts, settings, **init_kwargs)
    if "video_processor" in cls.get_attributes() and processor.video_processor is None:
        processor.video_processor = NoVideoProcessor()
    return processor
