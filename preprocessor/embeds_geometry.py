"""What each vision family needs beside precomputed image features (image_embeds), and what its processor makes of it.

An image's tokens depend on its geometry: Qwen-VL's (t, h, w) patch grid, LLaVA-OneVision's original size, the tiles
Idefics3 / SmolVLM cut, Gemma 3's pan-and-scan crops, Gemma 4's soft-token count. For a picture the model's image
processor finds it; for image_embeds the caller sends it, by the key vLLM (or, where vLLM names none, HF's image
processor) uses, and each family here turns it into the outputs the image processor would have made, which the
processor's own replace_image_token then lays out as text (preprocessor/mm_embeds.py). Where the rows alone settle
the geometry (LLaVA's fixed count, Gemma's crops and soft tokens, an Idefics3 image left whole) no key is needed.

Each family bounds what it is sent before the processor expands it: no geometry may make more image tokens than the
context holds, nor a layout the model's own processor could not make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from preprocessor.content import Where
from splice.errors import InvalidArgument
from splice.families import by_processor


@dataclass(frozen=True)
class Given:
    """One image_embeds part: its geometry as integers, and the rows its tensor declares."""

    where: Where
    values: dict[str, tuple[int, ...]]  # geometry key -> its integers (flattened)
    rows: int


@dataclass(frozen=True)
class Bounds:
    max_rows: int  # image tokens one image may make: fewer than the context (max_model_len)
    max_side: int  # pixels of an image's side (--max-image-side), for sizes sent instead of pictures


def _ints(g: Given, key: str, n: int, meaning: str) -> tuple[int, ...]:
    values = g.values[key]
    if len(values) != n or any(v < 1 for v in values):
        raise InvalidArgument(f"{g.where}: image_embeds {key} is {list(values)}; expected {n} positive integers "
                              f"({meaning})")
    return values


def _flat_array(*shape: int) -> np.ndarray:
    """An array of `shape` that holds one value: where a processor reads an output's shape only."""
    return np.broadcast_to(np.zeros((), np.float32), shape)


class Family:
    """Defaults: no key beside the rows."""

    keys: ClassVar[tuple[str, ...]] = ()  # geometry keys; every one required unless `optional`
    optional: ClassVar[bool] = False  # the keys may be left out where the rows settle the geometry
    to_engine: ClassVar[tuple[str, ...]] = ()  # keys the engine reads too, as [images, n] int64 tensors

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        """The image processor's outputs for `images` (the request's, in order, or one of them), each image's geometry
        checked; InvalidArgument naming the part."""
        raise NotImplementedError


class Fixed(Family):
    """LLaVA: a fixed run per image; the processor reads only the processed pictures' size (their shape)."""

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        ip = processor.image_processor
        size = ip.crop_size if getattr(ip, "do_center_crop", False) else ip.size
        side = size.get("shortest_edge")
        height, width = (side, side) if side else (size["height"], size["width"])
        return {"pixel_values": [_flat_array(3, height, width) for _ in images]}


class Tiles(Family):
    """Idefics3 / SmolVLM: `rows` x `cols` tiles (as the image processor returns them with return_row_col_info) and
    the global view; an image left whole (rows = cols = 0) needs neither key."""

    keys = ("rows", "cols")
    optional = True

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        ip = processor.image_processor
        most = math.ceil(ip.size["longest_edge"] / ip.max_image_size["longest_edge"])  # tiles per side at most
        rows, cols = [], []
        for g in images:
            if not g.values:
                whole = processor.image_seq_len
                if g.rows != whole:
                    raise InvalidArgument(f"{g.where}: image_embeds has {g.rows} rows without rows and cols: an image "
                                          f"left whole makes {whole}; send a tiled image's rows and cols")
                rows.append(0)
                cols.append(0)
                continue
            r, c = (self._count(g, k, most) for k in self.keys)
            if (r == 0) != (c == 0):
                raise InvalidArgument(f"{g.where}: image_embeds rows {r} and cols {c}: both 0 (the image left whole) "
                                      f"or both positive")
            rows.append(r)
            cols.append(c)
        return {"rows": [rows], "cols": [cols]}

    @staticmethod
    def _count(g: Given, key: str, most: int) -> int:
        values = g.values[key]
        if len(values) != 1 or not 0 <= values[0] <= most:
            raise InvalidArgument(f"{g.where}: image_embeds {key} is {list(values)}; expected one integer from 0 to "
                                  f"{most} (the tiles per side this model's image processor cuts at most)")
        return values[0]


class SmartTiles(Family):
    """LFM2-VL: image_rows x image_cols tiles (1 x 1: the image resized whole) and image_sizes, the (height, width)
    it was resized to for the single view or the thumbnail, as its image processor returns them with
    return_row_col_info."""

    keys = ("image_rows", "image_cols", "image_sizes")

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        ip = processor.image_processor
        patch = ip.encoder_patch_size * ip.downsample_factor  # pixels per side of one soft token
        for g in images:
            (r,), (c,) = _ints(g, "image_rows", 1, "tile rows"), _ints(g, "image_cols", 1, "tile columns")
            h, w = _ints(g, "image_sizes", 2, "height, width")
            if r * c > ip.max_tiles:
                raise InvalidArgument(f"{g.where}: image_embeds has {r} x {c} tiles; this model's image processor "
                                      f"cuts at most {ip.max_tiles}")
            if -(-h // patch) * -(-w // patch) > ip.max_image_tokens:
                raise InvalidArgument(f"{g.where}: image_embeds image_sizes {[h, w]} is larger than this model's "
                                      f"image processor resizes to ({ip.max_image_tokens} tokens of {patch} x {patch} "
                                      f"pixels at most)")
        return {"image_rows": [g.values["image_rows"][0] for g in images],
                "image_cols": [g.values["image_cols"][0] for g in images],
                "image_sizes": [list(g.values["image_sizes"]) for g in images]}


class PatchGrid(Family):
    """Qwen2-VL, Qwen2.5-VL, Qwen3.5: image_grid_thw (t, h, w) patches, merged merge x merge into one row; the engine
    lays the rows on this grid (M-RoPE), so it travels too."""

    keys = ("image_grid_thw",)
    to_engine = ("image_grid_thw",)

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        merge = processor.image_processor.merge_size
        for g in images:
            t, h, w = _ints(g, "image_grid_thw", 3, "t, h, w")
            if h % merge or w % merge or t * h * w // merge**2 > bounds.max_rows:
                raise InvalidArgument(f"{g.where}: image_embeds image_grid_thw is {[t, h, w]}; h and w must be "
                                      f"multiples of the merge size {merge}, making at most {bounds.max_rows} rows")
        return {"image_grid_thw": torch.tensor([g.values["image_grid_thw"] for g in images])}


class HwGrid(Family):
    """Nemotron 3 Nano Omni: image_grid_hw (h, w) patches, pixel-shuffled merge x merge into one row."""

    keys = ("image_grid_hw",)

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        merge = round(1 / processor.image_processor.downsample_ratio)
        for g in images:
            h, w = _ints(g, "image_grid_hw", 2, "h, w")
            if h % merge or w % merge or h * w // merge**2 > bounds.max_rows:
                raise InvalidArgument(f"{g.where}: image_embeds image_grid_hw is {[h, w]}; both must be multiples of "
                                      f"{merge}, making at most {bounds.max_rows} rows")
        return {"image_grid_hw": torch.tensor([g.values["image_grid_hw"] for g in images])}


class AnyRes(Family):
    """LLaVA-OneVision: image_sizes (height, width) of the original picture, which picks its crop grid. The processor
    hands its image processor the request's pictures as one flat list, which crops each of them (HF leaves a prompt's
    images uncropped only when they come nested per prompt)."""

    keys = ("image_sizes",)

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        for g in images:
            h, w = _ints(g, "image_sizes", 2, "height, width")
            if max(h, w) > bounds.max_side:
                raise InvalidArgument(f"{g.where}: image_embeds image_sizes is {[h, w]}; each side at most "
                                      f"{bounds.max_side} pixels (--max-image-side)")
        size = processor.image_processor.size
        return {"image_sizes": [g.values["image_sizes"] for g in images], "batch_num_images": [1] * len(images),
                "pixel_values": [[_flat_array(3, size["height"], size["width"])]]}


class Crops(Family):
    """Gemma 3: mm_tokens_per_image rows for the picture, as many again per pan-and-scan crop: the rows say how many
    crops."""

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        per = processor.image_seq_length
        most = 1 + int(getattr(processor.image_processor, "pan_and_scan_max_num_crops", 0) or 0)
        crops = []
        for g in images:
            if g.rows % per or not 1 <= g.rows // per <= most:
                raise InvalidArgument(f"{g.where}: image_embeds has {g.rows} rows; expected {per} per view (the "
                                      f"picture and up to {most - 1} pan-and-scan crops)")
            crops.append(g.rows // per - 1)
        return {"num_crops": crops}


class SoftTokens(Family):
    """Gemma 4: an image's soft-token count varies with its size, up to the image processor's budget: the rows are
    the count."""

    def outputs(self, processor: Any, images: list[Given], bounds: Bounds) -> dict[str, Any]:
        most = processor.image_processor.max_soft_tokens
        for g in images:
            if g.rows > most:
                raise InvalidArgument(f"{g.where}: image_embeds has {g.rows} rows; an image makes at most {most} soft "
                                      f"tokens on this model")
        return {"num_soft_tokens_per_image": [g.rows for g in images]}


# geometry kind (splice/families.py `geometry`) -> what a family's image_embeds carry and make
GEOMETRIES: dict[str, Family] = {
    "fixed": Fixed(),
    "tiles": Tiles(),
    "smart_tiles": SmartTiles(),
    "patch_grid": PatchGrid(),
    "hw_grid": HwGrid(),
    "any_res": AnyRes(),
    "crops": Crops(),
    "soft_tokens": SoftTokens(),
}


def geometry_for(processor_class: str) -> Family | None:
    """The geometry of the family whose processors are of class `processor_class`; None where none is declared."""
    declared = by_processor(processor_class)
    return GEOMETRIES[declared.geometry] if declared is not None and declared.geometry is not None else None
