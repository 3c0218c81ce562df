"""A request's image-processor arguments (vLLM's mm_processor_kwargs): the ones a model's processor takes that
Splice serves, each checked, passed to the processor as its images_kwargs.

Only arguments that change how many tokens an image becomes, within what the model's own processor config
allows: the engine then gets tensors of a shape its family serves, and a request cannot make an image cost more
than the operator's config lets it (vLLM, for the same reason, refuses every mm_processor_kwargs unless the
server trusts them). Any other key is refused naming it, never passed on: a processor drops keyword arguments it
does not know without a word (Qwen2-VL's processor ignores a plain `max_pixels`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from preprocessor.model_files import ModelFiles
from splice.errors import InvalidArgument
from splice.families import by_processor

Check = Callable[[str, Any, Any], None]  # (key, value, the image processor): raises InvalidArgument


def _flag(key: str, value: Any, image_processor: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"mm_processor_kwargs.{key} must be true or false, got {value!r}")


def _pixels(key: str, value: Any, image_processor: Any) -> None:
    """At least one pixel, at most the processor's configured most (its size.longest_edge: a pixel count)."""
    most = image_processor.size["longest_edge"]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidArgument(f"mm_processor_kwargs.{key} must be a pixel count from 1 to {most} (this model's "
                              f"max_pixels), got {value!r}")


# an argument a family may take (splice/families.py `mm_kwargs`) -> its check
CHECKS: dict[str, Check] = {"min_pixels": _pixels, "max_pixels": _pixels, "do_image_splitting": _flag}


def processor_kwargs(requested: dict[str, Any], files: ModelFiles) -> dict[str, Any]:
    """`requested` checked against what this model's processor takes: the processor's keyword arguments."""
    if not requested:
        return {}
    processor = files.processor
    name = type(processor).__name__ if processor is not None else None
    declared = by_processor(name or "")
    takes = {key: CHECKS[key] for key in declared.mm_kwargs} if declared is not None else {}
    unknown = sorted(set(requested) - set(takes))
    if unknown:
        offer = f"it takes {sorted(takes)}" if takes else "it takes none"
        model = f"this model's processor ({name})" if name else "this model (text only, no processor)"
        raise InvalidArgument(f"mm_processor_kwargs {unknown} are not served for {model}; {offer}")
    for key, value in requested.items():
        takes[key](key, value, processor.image_processor)
    images_kwargs = dict(requested)
    if "min_pixels" in requested or "max_pixels" in requested:
        # transformers 5 reads pixel bounds from `size` (its min_pixels / max_pixels arguments are deprecated)
        size = processor.image_processor.size
        high = images_kwargs.pop("max_pixels", size["longest_edge"])
        low = images_kwargs.pop("min_pixels", min(size["shortest_edge"], high))  # a lower max lowers the min
        if low > high:
            raise InvalidArgument(f"mm_processor_kwargs: min_pixels ({low}) is above max_pixels ({high})")
        images_kwargs["size"] = {"shortest_edge": low, "longest_edge": high}
    return {"images_kwargs": images_kwargs}
