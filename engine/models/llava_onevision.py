"""LLaVA-OneVision (LlavaOnevisionForConditionalGeneration): any-resolution crops, one contiguous run per image.

An image is a base view plus a grid of crops chosen from `image_grid_pinpoints` by its size; HF packs the
crops' features back into one grid, cuts the letterbox padding off (unpad), shrinks grids over the
`anyres_max_N` budget (bilinear), appends the image-newline row to every feature row and puts the base
view's rows first. So the rows an image makes depend on its original size (`image_sizes`); they are
computed here from the config alone, the same arithmetic as HF's pack_image_features, before any forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from engine.models.base import ImageGeometry, ModelFamily, check_float, check_names, feature_rows
from splice.errors import FailedPrecondition, InvalidArgument

INTEGER = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@dataclass(frozen=True)
class OnevisionImages(ImageGeometry):
    """pixel_values [images, crops, channels, side, side] (zero crops pad an image to the longest),
    image_sizes [images, 2] (height, width before resizing), batch_num_images [prompts] (optional: an image
    of a prompt with several images is not cropped, only its base view is used, as HF does)."""

    channels: int
    side: int  # pixels of one crop (the vision tower's image_size)
    patch_size: int
    pinpoints: tuple[tuple[int, int], ...]  # (height, width) resolutions a cropped image is resized to
    max_crops: int  # N of vision_aspect_ratio "anyres_max_N": feature grids above N crops' worth are shrunk

    @classmethod
    def from_config(cls, config: Any) -> OnevisionImages:
        if not isinstance(config.vision_feature_layer, int):
            raise FailedPrecondition("llava_onevision with several vision_feature_layer values is not supported")
        vc = config.vision_config
        pinpoints = tuple((int(h), int(w)) for h, w in config.image_grid_pinpoints)
        if any(h % vc.image_size or w % vc.image_size for h, w in pinpoints):
            raise FailedPrecondition(f"image_grid_pinpoints {pinpoints} are not multiples of {vc.image_size}")
        aspect = str(config.vision_aspect_ratio)
        if not aspect.startswith("anyres_max_") or not aspect.removeprefix("anyres_max_").isdigit():
            raise FailedPrecondition(f"vision_aspect_ratio {aspect!r} is not anyres_max_<crops>")
        return cls(vc.num_channels, vc.image_size, vc.patch_size, pinpoints, int(aspect.removeprefix("anyres_max_")))

    @property
    def grid_side(self) -> int:
        """Feature rows along one side of a crop; HF's pack requires side**2 rows per crop."""
        return self.side // self.patch_size

    def crop_grid(self, height: int, width: int) -> tuple[int, int]:
        """(crop rows, crop columns) of an image of that original size."""
        from transformers.image_processing_utils import select_best_resolution

        best_h, best_w = select_best_resolution((height, width), [list(p) for p in self.pinpoints])
        return best_h // self.side, best_w // self.side

    def crops(self, height: int, width: int, cropped: bool) -> int:
        """Crops (base view included) the image's pixel_values hold."""
        rows, cols = self.crop_grid(height, width)
        return rows * cols + 1 if cropped else 1

    def rows(self, height: int, width: int, cropped: bool) -> int:
        """Feature rows of one image, as HF's pack_image_features makes them (image newline included)."""
        base = self.grid_side**2
        if not cropped:
            return base + 1  # the base view and one newline row
        crop_rows, crop_cols = self.crop_grid(height, width)
        cur_h, cur_w = crop_rows * self.grid_side, crop_cols * self.grid_side
        # unpad_image: keep the rows (or columns) the resized picture covers; slicing as HF slices its tensor
        if width / height > cur_w / cur_h:
            pad = (cur_h - int(round(height * (cur_w / width), 7))) // 2
            cur_h = len(range(cur_h)[pad:cur_h - pad])
        else:
            pad = (cur_w - int(round(width * (cur_h / height), 7))) // 2
            cur_w = len(range(cur_w)[pad:cur_w - pad])
        ratio = math.sqrt(cur_h * cur_w / (self.max_crops * self.grid_side**2))
        if ratio > 1.1:  # HF interpolates the grid down to this size
            cur_h, cur_w = int(cur_h // ratio), int(cur_w // ratio)
        return base + cur_h * (cur_w + 1)  # every grid row ends with the newline row

    def _sizes(self, inputs: dict[str, torch.Tensor], images: int) -> list[tuple[int, int]]:
        sizes = inputs["image_sizes"]
        if sizes.dtype not in INTEGER or tuple(sizes.shape) != (images, 2):
            raise InvalidArgument(f"image_sizes: {sizes.dtype} {list(sizes.shape)}, expected integer [{images}, 2] "
                                  f"(height, width of each of the {images} images in pixel_values)")
        if bool((sizes < 1).any()):
            raise InvalidArgument(f"image_sizes: {sizes.tolist()}, every height and width must be >= 1")
        return [(int(h), int(w)) for h, w in sizes.tolist()]

    def _cropped(self, inputs: dict[str, torch.Tensor], images: int) -> list[bool]:
        counts = inputs.get("batch_num_images")
        if counts is None:
            return [True] * images  # HF: every image on its own
        if counts.dtype not in INTEGER or counts.dim() != 1 or bool((counts < 1).any()) or int(counts.sum()) != images:
            raise InvalidArgument(f"batch_num_images: {counts.dtype} {counts.tolist()}, expected a 1-D integer "
                                  f"count per prompt, each >= 1, summing to {images} images")
        return [n == 1 for n in counts.tolist() for _ in range(n)]

    def expected_rows(self, inputs: dict[str, torch.Tensor]) -> int:
        check_names(inputs, ("pixel_values", "image_sizes", "batch_num_images"), ("pixel_values", "image_sizes"))
        pv = inputs["pixel_values"]  # [images, crops, channels, side, side]
        want = (self.channels, self.side, self.side)
        if pv.dim() != 5 or tuple(pv.shape[2:]) != want:
            raise InvalidArgument(
                f"pixel_values: shape {list(pv.shape)}, expected [images, crops, {', '.join(map(str, want))}]")
        check_float("pixel_values", pv)
        sizes = self._sizes(inputs, pv.shape[0])
        cropped = self._cropped(inputs, pv.shape[0])
        crops = max(self.crops(h, w, c) for (h, w), c in zip(sizes, cropped, strict=True))
        if pv.shape[1] != crops:
            raise InvalidArgument(f"pixel_values: {pv.shape[1]} crops per image, expected {crops} (the most any "
                                  f"image makes at its image_sizes with image_grid_pinpoints {list(self.pinpoints)})")
        return sum(self.rows(h, w, c) for (h, w), c in zip(sizes, cropped, strict=True))


class LlavaOnevision(ModelFamily):
    name = "llava_onevision"

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(model, device, dtype)
        self.images = OnevisionImages.from_config(self.config)

    def image_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        pv = inputs["pixel_values"].to(device=self.device, dtype=self.dtype)
        sizes = inputs["image_sizes"].to(device=self.device, dtype=torch.long)
        counts = inputs.get("batch_num_images")
        out = self.model.get_image_features(pixel_values=pv, image_sizes=sizes,
                                            batch_num_images=None if counts is None else counts.tolist())
        return feature_rows(out)  # [sum of rows per image, hidden], images in order
