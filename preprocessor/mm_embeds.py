"""Precomputed image features: vLLM's image_embeds content parts, accepted with --enable-mm-embeds (off by default,
as in vLLM: the caller's rows go into the model unexamined by its vision tower).

A part holds what the model's vision tower and projector make of one picture (the rows its language model
merges, [rows, hidden] or [1, rows, hidden], in any prompt_embeds encoding), beside the geometry its family needs
(embeds_geometry.py). The image's placeholder is expanded exactly as for a picture of that geometry: the model's
processor runs on the rendered prompt with its image processor stood in for by the geometry, so that its own
replace_image_token writes the image's tokens, and the part's rows must equal the image tokens it wrote for that
image. Every check (the flag, key names, geometry, rows, hidden size, dtype, size cap) comes before the rows are
allocated; their values are checked finite as prompt_embeds' are.

To the engine the rows go as one IMAGE_EMBEDS tensor, beside what its positions read (Qwen's image_grid_thw), and
are merged at the image-token positions: the prompt's IDs are the picture's own, no sentinel and no ID outside the
vocabulary is involved, and the positions and masks images get (M-RoPE, Gemma 3's bidirectional image runs) are
the picture's.
"""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image as PILImage

from preprocessor.admission import charge
from preprocessor.content import Conversation, GeometryValue, Image, ImageEmbeds, Where
from preprocessor.embeds import decode_embeds, load_torch_save
from preprocessor.embeds_geometry import Bounds, Family, Given, geometry_for
from preprocessor.limits import Limits
from preprocessor.model_files import ModelFiles
from preprocessor.torch_archive import check_archive
from splice.engine_request import IMAGE_EMBEDS
from splice.errors import FailedPrecondition, InvalidArgument
from splice.model_info import ModelInfo
from splice.request_rules import check_rows as check_context_rows

FLAG = "--enable-mm-embeds"
# A geometry value is a few integers: its torch.save archive or JSON list is bounded accordingly.
MAX_GEOMETRY_VALUES = 16
MAX_GEOMETRY_ARCHIVE = 64 * 1024
# What the processor is handed for each image in place of a picture (its stand-in image processor ignores it).
_CARRIER = PILImage.new("RGB", (1, 1))


@dataclass(frozen=True)
class SuppliedImages:
    """A request's image_embeds parts, decoded and checked."""

    rows: tuple[int, ...]  # image tokens of each image, in placeholder order
    outputs: dict[str, Any]  # the image processor's outputs for them (what the processor lays their tokens out from)
    tensors: dict[str, torch.Tensor]  # for the engine: IMAGE_EMBEDS [sum of rows, hidden] and the family's to_engine

    def processor(self, files: ModelFiles) -> Any:
        """The model's processor with its image processor stood in for by these images' outputs."""
        clone = copy.copy(files.processor)
        clone.image_processor = _GeometryImageProcessor(files.processor.image_processor, self.outputs)
        return clone

    @property
    def carriers(self) -> list[PILImage.Image]:
        return [_CARRIER] * len(self.rows)


class _GeometryImageProcessor:
    """Stands in for a processor's image processor when its images come as features: it returns the outputs the
    real one would have made of pictures of that geometry; every other attribute is the real one's."""

    def __init__(self, real: Any, outputs: dict[str, Any]) -> None:
        self._real = real
        self._outputs = outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def fetch_images(self, images: Any) -> Any:
        return images

    def __call__(self, images: Any = None, **kwargs: Any) -> dict[str, Any]:
        return dict(self._outputs)


def check_allowed(conv: Conversation, limits: Limits) -> None:
    """image_embeds parts only with --enable-mm-embeds, never beside pictures (vLLM's rule), and without
    mm_processor_kwargs (they shape pictures; the parts carry their geometry)."""
    supplied = conv.parts(ImageEmbeds)
    if not supplied:
        return
    first = supplied[0].where
    if not limits.enable_mm_embeds:
        raise FailedPrecondition(f"{first}: image_embeds parts are off on this server; start the preprocessor (or "
                                 f"`splice up`) with {FLAG} to accept them")
    if conv.parts(Image):
        raise InvalidArgument(f"{first}: image_embeds beside image parts in one request: mixing raw image and "
                              f"embedding inputs is not allowed (as in vLLM); send all images one way")
    if conv.mm_processor_kwargs:
        raise InvalidArgument(f"mm_processor_kwargs {sorted(conv.mm_processor_kwargs)} apply to pictures; the "
                              f"request's images are image_embeds, which carry their geometry ({first})")


def _family(files: ModelFiles, where: Where) -> Family:
    name = type(files.processor).__name__ if files.processor is not None else ""
    family = geometry_for(name)
    if family is None:
        raise FailedPrecondition(f"{where}: image_embeds are not served for this model's processor ({name or 'none'})")
    return family


def _flatten(value: list, what: str, depth: int = 0) -> list[int]:
    out: list[int] = []
    for v in value:
        if isinstance(v, list) and depth < 2:
            out += _flatten(v, what, depth + 1)
        elif isinstance(v, int) and not isinstance(v, bool):
            out.append(v)
        else:
            raise InvalidArgument(f"{what} must hold integers, got {v!r}"[:300])
        if len(out) > MAX_GEOMETRY_VALUES:
            raise InvalidArgument(f"{what} holds more than {MAX_GEOMETRY_VALUES} integers")
    return out


def _from_torch_save(text: str, what: str) -> list[int]:
    if len(text) * 3 // 4 > MAX_GEOMETRY_ARCHIVE:
        raise InvalidArgument(f"{what} is {len(text)} characters; a geometry tensor's archive is at most "
                              f"{MAX_GEOMETRY_ARCHIVE} bytes")
    try:
        blob = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"{what} is not valid base64: {exc}") from None
    check_archive(blob, what, MAX_GEOMETRY_ARCHIVE)
    tensor = load_torch_save(blob, "cpu", what)
    if type(tensor) is not torch.Tensor or tensor.layout != torch.strided or tensor.is_nested:
        raise InvalidArgument(f"{what} holds a {type(tensor).__name__}; send a dense integer tensor")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise InvalidArgument(f"{what} has dtype {str(tensor.dtype).removeprefix('torch.')}; expected integers")
    if tensor.numel() > MAX_GEOMETRY_VALUES:
        raise InvalidArgument(f"{what} holds {tensor.numel()} integers; at most {MAX_GEOMETRY_VALUES}")
    return tensor.flatten().tolist()


def _integers(value: GeometryValue, what: str) -> tuple[int, ...]:
    """A geometry value as sent (integers, a JSON list, or base64 of torch.save(tensor)) -> its integers."""
    if isinstance(value, str):
        return tuple(_from_torch_save(value, what))
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, tuple):
        if len(value) > MAX_GEOMETRY_VALUES:
            raise InvalidArgument(f"{what} holds {len(value)} integers; at most {MAX_GEOMETRY_VALUES}")
        return value
    if isinstance(value, list):
        return tuple(_flatten(value, what))
    raise InvalidArgument(f"{what} must be integers, got {type(value).__name__}")


def _geometry(part: ImageEmbeds, family: Family) -> dict[str, tuple[int, ...]]:
    unknown = sorted(set(part.geometry) - set(family.keys))
    if unknown:
        takes = f"it takes {list(family.keys)}" if family.keys else "it takes none (the rows settle the geometry)"
        raise InvalidArgument(f"{part.where}: image_embeds keys {unknown} are not read for this model; {takes}")
    missing = [k for k in family.keys if k not in part.geometry]
    if missing and not (family.optional and len(missing) == len(family.keys)):
        raise InvalidArgument(f"{part.where}: image_embeds needs {missing} beside the rows on this model (send a dict "
                              f"{{'image_embeds': ..., {', '.join(repr(k) + ': ...' for k in family.keys)}}})")
    return {k: _integers(v, f"{part.where}: image_embeds {k}") for k, v in part.geometry.items()}


def _expected(files: ModelFiles, info: ModelInfo, family: Family, given: Given, bounds: Bounds) -> int:
    """Image tokens the processor writes for this one image (family.outputs bounds what it may be asked to write)."""
    outputs = family.outputs(files.processor, [given], bounds)
    text = files.processor.replace_image_token(outputs, image_idx=0)
    return files.tokenizer(text, add_special_tokens=False)["input_ids"].count(info.image_token_id)


def _describe(given: Given) -> str:
    return ", ".join(f"{k} {list(v)}" for k, v in given.values.items()) or "this model's image layout"


def decode_image_embeds(parts: Sequence[ImageEmbeds], files: ModelFiles, info: ModelInfo,
                        limits: Limits) -> SuppliedImages:
    """Each part's geometry and rows checked against each other (rows from the tensor's header, before it is
    allocated), decoded in order; the engine's tensors joined."""
    family = _family(files, parts[0].where)
    bounds = Bounds(info.max_model_len - 1, limits.max_image_side)
    given: list[Given] = []
    features: list[torch.Tensor] = []
    for part in parts:
        values = _geometry(part, family)

        def check_rows(n: int, part: ImageEmbeds = part, values: dict = values) -> None:
            g = Given(part.where, values, n)
            want = _expected(files, info, family, g, bounds)
            if n != want:
                raise InvalidArgument(f"{part.where}: image_embeds has {n} rows; {_describe(g)} makes {want} image "
                                      f"tokens")

        features.append(decode_embeds(part.embeds, info, limits, check_rows))  # [rows, hidden]
        given.append(Given(part.where, values, features[-1].shape[0]))
        # no further part is decoded once the rows alone fill the context
        check_context_rows(sum(g.rows for g in given), info, f"{part.where}: the image_embeds up to this part")
    if len(features) > 1:
        charge(sum(f.numel() * f.element_size() for f in features), "joining the request's image_embeds")
    tensors = {IMAGE_EMBEDS: torch.cat(features) if len(features) > 1 else features[0]}  # [sum of rows, hidden]
    for key in family.to_engine:
        tensors[key] = torch.tensor([g.values[key] for g in given], dtype=torch.int64)  # [images, n]
    outputs = family.outputs(files.processor, given, bounds)
    return SuppliedImages(tuple(g.rows for g in given), outputs, tensors)
