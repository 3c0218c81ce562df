"""Processors without their video processor, for machines without torchvision.

transformers 5's ProcessorMixin builds (and type-checks) every sub-processor its class's __init__ names; a
video processor needs torchvision, so on a CPU install a LLaVA-OneVision, SmolVLM or Qwen2-VL processor can
neither be constructed nor loaded, although images only need the tokenizer and the PIL image processor.
`images_only(cls)` is `cls` with its video processor left out of the sub-processors: same class name and
methods (an instance is an instance of `cls`), so it saves the processor_config.json `cls` would, and
`load_images_only` builds it back from the tokenizer and the PIL image processor.
"""

from __future__ import annotations

import inspect
import json
from functools import cache
from pathlib import Path
from typing import Any

LEFT_OUT = ("video_processor",)  # the sub-processors that need torchvision


class NoVideoProcessor:
    """Where the video processor would be: SmolVLM's apply_chat_template reads its sampling defaults even for a
    chat without videos (there are none); processing a video is refused."""

    num_frames = None
    fps = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("videos need a video processor, which needs torchvision")


@cache
def images_only(cls: type) -> type:
    """`cls` (a ProcessorMixin) without the LEFT_OUT sub-processors: pass None for them. They must come last
    among the sub-processors its __init__ passes on positionally (true of the image+video processors); if
    not, the base class's type check refuses the shifted arguments."""
    attributes = [a for a in cls.get_attributes() if a not in LEFT_OUT]
    return type(cls.__name__, (cls,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                       "get_attributes": classmethod(lambda _: list(attributes)),
                                       "video_processor": NoVideoProcessor()})


def load_images_only(path: str) -> Any:
    """The processor named by `path`'s processor config, built from its tokenizer and PIL image processor."""
    import transformers

    name = None
    for file in ("processor_config.json", "preprocessor_config.json"):  # older checkpoints name it in the latter
        if name is None and (Path(path) / file).exists():
            name = json.loads((Path(path) / file).read_text()).get("processor_class")
    cls = getattr(transformers, name or "", None)
    if cls is None or not set(LEFT_OUT) & set(cls.get_attributes()):
        raise ValueError(f"processor class {name!r}: no sub-processor to leave out")
    parts = {
        "tokenizer": transformers.AutoTokenizer.from_pretrained(path, local_files_only=True),
        "image_processor": transformers.AutoImageProcessor.from_pretrained(path, local_files_only=True,
                                                                           backend="pil"),
    }
    # Positional, in the order of cls.__init__, with None for the left-out ones (their parameter may be required)
    attributes = set(cls.get_attributes())
    args = [parts.get(p) for p in list(inspect.signature(cls.__init__).parameters)[1:] if p in attributes]
    images_cls = images_only(cls)
    processor_dict, kwargs = images_cls.get_processor_dict(path, local_files_only=True)
    return images_cls.from_args_and_dict(args, processor_dict, **kwargs)
