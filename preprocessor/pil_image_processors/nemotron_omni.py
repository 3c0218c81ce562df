"""Nemotron 3 Nano Omni's (RADIO) image processor on PIL: transformers ships it only for torchvision.

It makes the same tensors as the torchvision original (same geometry, same layout, same normalization); the
resize is PIL's (bicubic on float32 planes, antialiased like torchvision's), so pixel values agree to
resampling precision, not bit for bit.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
from PIL import Image
from transformers.image_processing_backends import PilBackend
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling
from transformers.processing_utils import ImagesKwargs


class NemotronOmniImagesKwargs(ImagesKwargs, total=False):
    """The original's keyword set (its module imports torchvision, so it is restated here)."""

    patch_size: int
    downsample_ratio: float
    min_num_patches: int
    max_num_patches: int
    max_model_len: int


def nemotron_omni_patch_grid(height: int, width: int, patch_size: int, merge: int, min_patches: int,
                             max_patches: int) -> tuple[int, int]:
    """The (grid_height, grid_width) an image is resized to, exactly as the original's get_patch_grid_size: close
    to the image's own grid, scaled into [min_patches, max_patches], both sides multiples of `merge`."""
    gh, gw = round(height / patch_size + 0.5), round(width / patch_size + 0.5)  # floor(x) + 1 unless integral
    factor = min(math.sqrt(max_patches / (gh * gw)), 1.0)
    gh, gw = math.floor(factor * gh), math.floor(factor * gw)
    if max_patches > min_patches and gh * gw < min_patches:
        factor = math.sqrt(min_patches / (gh * gw))
        gh, gw = math.ceil(factor * gh), math.ceil(factor * gw)
    if rem := gh % merge:
        gh = gh + merge - rem if (gh + merge - rem) * gw <= max_patches else max(merge, gh - rem)
    if rem := gw % merge:
        gw = gw + merge - rem if gh * (gw + merge - rem) <= max_patches else max(merge, gw - rem)
    return gh, gw


class NemotronH_Omni_Reasoning_V3ImageProcessorPil(PilBackend):  # transformers' name + "Pil"
    """Nemotron 3 Nano Omni (RADIO): each image resized to a patch grid whose sides are multiples of the
    pixel-shuffle merge, cut into channel-major patches.

    pixel_values [total_patches, channels * patch_size**2] (all images concatenated), image_grid_hw [images, 2].
    """

    resample = PILImageResampling.BICUBIC
    do_rescale = True
    do_normalize = True
    image_mean = OPENAI_CLIP_MEAN
    image_std = OPENAI_CLIP_STD
    do_convert_rgb = True
    patch_size = 16
    downsample_ratio = 0.5
    min_num_patches = 1024
    max_num_patches = 13312
    max_model_len = 16384
    model_input_names: ClassVar[list[str]] = ["pixel_values", "image_grid_hw"]
    valid_kwargs = NemotronOmniImagesKwargs

    def __init__(self, **kwargs) -> None:
        # released checkpoints store the normalization statistics as norm_mean / norm_std
        if (norm_mean := kwargs.pop("norm_mean", None)) is not None:
            kwargs.setdefault("image_mean", norm_mean)
        if (norm_std := kwargs.pop("norm_std", None)) is not None:
            kwargs.setdefault("image_std", norm_std)
        kwargs.pop("_downsample_factor", None)
        super().__init__(**kwargs)

    def _preprocess(self, images: list[np.ndarray], resample, do_rescale: bool, rescale_factor: float,
                    do_normalize: bool, image_mean, image_std, patch_size: int, downsample_ratio: float,
                    min_num_patches: int, max_num_patches: int, max_model_len: int, return_tensors=None,
                    **kwargs) -> BatchFeature:
        merge = round(1 / downsample_ratio)
        # every image of the call gets the same patch budget, as in the original
        budget = max((max_model_len - 4) * merge**2, min_num_patches * len(images))
        if max_num_patches:
            budget = min(budget, max_num_patches)
        budget = max(budget, min_num_patches)
        patches, grids = [], []
        for image in images:  # [channels, height, width]
            height, width = image.shape[-2:]
            gh, gw = nemotron_omni_patch_grid(height, width, patch_size, merge, min_num_patches, budget)
            pixels = image.astype(np.float32)
            if (height, width) != (gh * patch_size, gw * patch_size):
                pixels = _resize_planes(pixels, gh * patch_size, gw * patch_size, resample)
            if do_rescale:
                pixels = pixels * rescale_factor
            if do_normalize:
                mean = np.asarray(image_mean, dtype=np.float32)[:, None, None]
                std = np.asarray(image_std, dtype=np.float32)[:, None, None]
                pixels = (pixels - mean) / std
            channels = pixels.shape[0]
            cut = pixels.reshape(channels, gh, patch_size, gw, patch_size).transpose(1, 3, 0, 2, 4)
            patches.append(torch.from_numpy(np.ascontiguousarray(cut.reshape(gh * gw, -1))))
            grids.append([gh, gw])
        data = {"pixel_values": torch.cat(patches), "image_grid_hw": torch.tensor(grids, dtype=torch.long)}
        return BatchFeature(data=data, tensor_type=return_tensors)


def _resize_planes(pixels: np.ndarray, height: int, width: int, resample) -> np.ndarray:
    """[channels, h, w] float32 -> [channels, height, width], each plane as a PIL "F" image: float, so the
    bicubic overshoot is kept rather than clamped to uint8 (the original resizes float32 tensors)."""
    planes = [np.asarray(Image.fromarray(p, mode="F").resize((width, height), resample=int(resample)))
              for p in pixels]
    return np.stack(planes).astype(np.float32)
