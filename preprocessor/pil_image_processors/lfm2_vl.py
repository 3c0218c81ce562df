"""LFM2-VL's image processor on PIL/NumPy: transformers 5 ships only a torchvision one
(transformers/models/lfm2_vl/image_processing_lfm2_vl.py), and torchvision is never required here.

Same geometry, step for step: an image small enough is resized once (smart_resize: sides multiples of
patch * downsample, token count within [min_image_tokens, max_image_tokens]); a larger one is resized to a
grid of tile_size tiles (the grid closest to its aspect ratio within [min_tiles, max_tiles]) plus a thumbnail
at the smart_resize size. Every tile becomes [patches, patch * patch * channels] rows padded to
max_num_patches, with a pixel_attention_mask and its spatial_shapes [patches_h, patches_w]. The resize is
PIL's bilinear (antialiased on downscale) where the original uses torchvision's antialiased bilinear: the
same geometry and token counts, pixel values within resampling differences.
"""

from __future__ import annotations

import math

import numpy as np
from transformers.image_processing_backends import PilBackend
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling, SizeDict
from transformers.processing_utils import ImagesKwargs


class Lfm2VlImagesKwargs(ImagesKwargs, total=False):
    downsample_factor: int
    do_image_splitting: bool
    min_tiles: int
    max_tiles: int
    use_thumbnail: bool
    min_image_tokens: int
    max_image_tokens: int
    encoder_patch_size: int
    tile_size: int
    max_pixels_tolerance: float
    do_pad: bool
    return_row_col_info: bool


def round_by_factor(number: float, factor: int) -> int:
    return round(number / factor) * factor


def closest_aspect_ratio(aspect: float, ratios: list[tuple[int, int]], width: int, height: int,
                         tile_size: int) -> tuple[int, int]:
    """(grid_width, grid_height) whose ratio is closest to `aspect`; ties go to the larger grid when the image
    covers more than half of its area."""
    best_diff, best = float("inf"), (1, 1)
    for ratio in ratios:
        diff = abs(aspect - ratio[0] / ratio[1])
        if diff < best_diff:
            best_diff, best = diff, ratio
        elif diff == best_diff and width * height > 0.5 * tile_size * tile_size * ratio[0] * ratio[1]:
            best = ratio
    return best


def target_ratios(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    ratios = {(w, h) for n in range(min_tiles, max_tiles + 1) for w in range(1, n + 1) for h in range(1, n + 1)
              if min_tiles <= w * h <= max_tiles}
    return sorted(ratios, key=lambda r: r[0] * r[1])


def smart_resize(height: int, width: int, factor: int, patch: int, min_tokens: int,
                 max_tokens: int) -> tuple[int, int]:
    """(height, width): multiples of patch * factor, pixel count within the token bounds, aspect kept."""
    total = patch * factor
    min_pixels = min_tokens * patch**2 * factor**2
    max_pixels = max_tokens * patch**2 * factor**2
    h_bar = max(total, round_by_factor(height, total))
    w_bar = max(total, round_by_factor(width, total))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(total, math.floor(height / beta / total) * total)
        w_bar = max(total, math.floor(width / beta / total) * total)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / total) * total
        w_bar = math.ceil(width * beta / total) * total
    return h_bar, w_bar


def is_too_large(height: int, width: int, factor: int, patch: int, max_tokens: int, tolerance: float) -> bool:
    total = patch * factor
    h_bar = max(patch, round_by_factor(height, total))
    w_bar = max(patch, round_by_factor(width, total))
    return h_bar * w_bar > max_tokens * patch**2 * factor**2 * tolerance


def to_patches(image: np.ndarray, patch: int) -> np.ndarray:
    """[channels, h, w] -> [h/patch * w/patch, patch * patch * channels], patches row-major, pixels (y, x, c)."""
    c, h, w = image.shape
    out = image.reshape(c, h // patch, patch, w // patch, patch).transpose(1, 3, 2, 4, 0)
    return out.reshape((h // patch) * (w // patch), -1)


class Lfm2VlImageProcessorPil(PilBackend):
    downsample_factor = 2
    do_image_splitting = True
    min_tiles = 2
    max_tiles = 10
    use_thumbnail = True
    min_image_tokens = 64
    max_image_tokens = 256
    encoder_patch_size = 16
    tile_size = 512
    max_pixels_tolerance = 2.0
    do_resize = True
    size = {"height": 512, "width": 512}  # noqa: RUF012 (transformers reads class-level defaults)
    resample = PILImageResampling.BILINEAR
    do_rescale = True
    rescale_factor = 1 / 255
    do_normalize = True
    do_pad = True
    return_row_col_info = False
    image_mean = IMAGENET_STANDARD_MEAN
    image_std = IMAGENET_STANDARD_STD
    valid_kwargs = Lfm2VlImagesKwargs
    model_input_names = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]  # noqa: RUF012

    def _tiles(self, image: np.ndarray, kw: dict) -> tuple[list[np.ndarray], int, int, list[int]]:
        """One image [c, h, w] -> (its tiles in order, rows, cols, [resized h, w])."""
        _, height, width = image.shape
        f, p = kw["downsample_factor"], kw["encoder_patch_size"]
        min_tiles, max_tiles = (kw["min_tiles"], kw["max_tiles"]) if kw["do_image_splitting"] else (1, 1)
        new_h, new_w = smart_resize(height, width, f, p, kw["min_image_tokens"], kw["max_image_tokens"])
        resample = kw["resample"]
        large = is_too_large(height, width, f, p, kw["max_image_tokens"], kw["max_pixels_tolerance"])
        if not (large and not min_tiles == max_tiles == 1):
            return [self.resize(image, SizeDict(height=new_h, width=new_w), resample=resample)], 1, 1, [new_h, new_w]
        tile = kw["tile_size"]
        cols, rows = closest_aspect_ratio(width / height, target_ratios(min_tiles, max_tiles), width, height, tile)
        grid = self.resize(image, SizeDict(height=tile * rows, width=tile * cols), resample=resample)
        tiles = [grid[:, r * tile:(r + 1) * tile, c * tile:(c + 1) * tile] for r in range(rows) for c in range(cols)]
        if kw["use_thumbnail"] and rows * cols != 1:
            tiles.append(self.resize(image, SizeDict(height=new_h, width=new_w), resample=resample))
        return tiles, rows, cols, [new_h, new_w]

    def _preprocess(self, images: list, **kw) -> BatchFeature:
        if images and isinstance(images[0], list | tuple):
            images = [im for nested in images for im in nested]
        if kw["do_image_splitting"] and kw["min_tiles"] > kw["max_tiles"]:
            raise ValueError("min_tiles must be less than or equal to max_tiles")
        f, p = kw["downsample_factor"], kw["encoder_patch_size"]
        tile_patches = (kw["tile_size"] // p) ** 2 if kw["do_image_splitting"] else 0
        max_patches = max(kw["max_image_tokens"] * f**2, tile_patches)
        values, masks, shapes, rows, cols, sizes = [], [], [], [], [], []
        for image in images:
            tiles, r, c, size = self._tiles(image, kw)
            rows.append(r)
            cols.append(c)
            sizes.append(size)
            for t in tiles:
                if kw["do_rescale"]:
                    t = self.rescale(t, kw["rescale_factor"])
                if kw["do_normalize"]:
                    t = self.normalize(t, kw["image_mean"], kw["image_std"])
                patches = to_patches(t.astype(np.float32), p)
                shapes.append([t.shape[1] // p, t.shape[2] // p])
                mask = np.ones(max_patches, dtype=np.int32)
                if kw["do_pad"] and patches.shape[0] < max_patches:
                    mask[patches.shape[0]:] = 0
                    patches = np.pad(patches, ((0, max_patches - patches.shape[0]), (0, 0)))
                values.append(patches)
                masks.append(mask)
        data = {"pixel_values": np.stack(values)}
        if kw["do_pad"]:
            data["pixel_attention_mask"] = np.stack(masks)
            data["spatial_shapes"] = np.array(shapes, dtype=np.int64)
        if kw["return_row_col_info"]:
            data.update(image_rows=rows, image_cols=cols, image_sizes=sizes)
        return BatchFeature(data=data, tensor_type=kw.get("return_tensors"))
