"""Image decoding: bytes, `data:` URL, or a file under the allowed media dir -> an RGB PIL image.

In two steps, so that a request's images are all checked before any is decoded: `open_image` reads the header
only (Pillow opens lazily) and checks it against the caps (bytes, pixels, side, aspect ratio); `image_cost`
checks the request's pixels together and says what decoding them will hold; `decode_image` decodes.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from PIL import Image as PILImage
from transformers.image_transforms import convert_to_rgb

from preprocessor.content import Image
from preprocessor.limits import Limits
from splice.errors import FailedPrecondition, InvalidArgument

# Only these decoders ever see a caller's bytes (Pillow's names; a JPEG with extra frames, MPO, opens as JPEG). Pillow
# would otherwise try each of its ~40 plugins, EPS (Ghostscript), PSD, TIFF and ICNS among them: code no model
# needs, each a parser of hostile input.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
ACCEPTED = "PNG, JPEG, WebP, GIF or BMP"
# What a decoded image holds per pixel while its request is processed: its RGB pixels (3 bytes) and the
# processor's arrays of them (measured: 4096x4096 images through the tiny families' processors take ~7 bytes per
# pixel each, and the one being resized ~7 more). Charged to the request's admission before decoding.
DECODED_BYTES_PER_PIXEL = 8
# Splice's pixel cap is checked from the header; PIL's own (89M pixels) would only warn below twice that, and
# refuses beyond it in open() (reported below with Splice's cap in the message).
warnings.filterwarnings("ignore", category=PILImage.DecompressionBombWarning)

_DATA_URL = re.compile(r"^data:(image/[A-Za-z0-9.+-]+)?(;[A-Za-z0-9=.+-]+)*;base64,", re.IGNORECASE)


@dataclass(frozen=True)
class OpenedImage:
    image: PILImage.Image  # opened lazily: its header read and checked, no pixel decoded
    part: Image
    encoded_bytes: int  # the file, held until decoded

    @property
    def pixels(self) -> int:
        return self.image.width * self.image.height


def load_image(part: Image, limits: Limits) -> PILImage.Image:
    """`part` decoded to RGB, after the checks of `open_image`."""
    return decode_image(open_image(part, limits), limits)


def open_image(part: Image, limits: Limits) -> OpenedImage:
    """`part`'s file with its header checked against the caps; nothing decoded."""
    if part.source == "data":
        blob = bytes(part.value)
    elif part.source == "url":
        blob = _from_data_url(str(part.value), part, limits)
    else:
        blob = _from_path(str(part.value), part, limits)
    _check_size(len(blob), part, limits)
    if not blob:
        raise InvalidArgument(f"{part.where}: image is empty")
    with _pil_errors(part, limits):
        img = PILImage.open(io.BytesIO(blob), formats=IMAGE_FORMATS)  # reads the header only
    _check_header(img.width, img.height, part, limits)
    return OpenedImage(img, part, len(blob))


def _check_header(width: int, height: int, part: Image, limits: Limits) -> None:
    size = f"{part.where}: image is {width}x{height}"
    if max(width, height) > limits.max_image_side:
        raise InvalidArgument(f"{size}; each side may be at most {limits.max_image_side} pixels (--max-image-side)")
    if min(width, height) < 1:
        raise InvalidArgument(f"{size}: it has no pixels")
    if max(width, height) > limits.max_image_aspect_ratio * min(width, height):
        raise InvalidArgument(f"{size}, {max(width, height) / min(width, height):.0f} times as long as it is wide; "
                              f"at most {limits.max_image_aspect_ratio:g} (--max-image-aspect-ratio)")
    if width * height > limits.max_image_pixels:
        raise InvalidArgument(f"{size} = {width * height} pixels; at most {limits.max_image_pixels}")


def image_cost(opened: Sequence[OpenedImage], limits: Limits, min_pixels: int = 0) -> int:
    """The bytes decoding a request's images will hold (their files and DECODED_BYTES_PER_PIXEL per pixel, the
    largest image twice), after checking their pixels together against the request's cap. `min_pixels`: what
    the processor resizes a smaller image up to (a request's mm_processor_kwargs may raise it), so each image
    counts as at least that many pixels."""
    if not opened:
        return 0
    pixels = [max(o.pixels, min_pixels) for o in opened]
    total = sum(pixels)
    if total > limits.max_request_image_pixels:
        at_least = f" (each at least {min_pixels}: mm_processor_kwargs.min_pixels)" if min_pixels else ""
        raise InvalidArgument(f"the request's {len(opened)} images have {total} pixels together{at_least}; at most "
                              f"{limits.max_request_image_pixels} (--max-request-image-pixels)")
    largest = max(pixels)
    return DECODED_BYTES_PER_PIXEL * (total + largest) + sum(o.encoded_bytes for o in opened)


def decode_image(opened: OpenedImage, limits: Limits) -> PILImage.Image:
    with _pil_errors(opened.part, limits):
        opened.image.load()
        return on_white(opened.image)


@contextmanager
def _pil_errors(part: Image, limits: Limits) -> Iterator[None]:
    """Pillow's exceptions for a caller's file as INVALID_ARGUMENT naming the part."""
    try:
        yield
    except PILImage.UnidentifiedImageError:  # none of IMAGE_FORMATS recognised the header
        raise InvalidArgument(f"{part.where}: image cannot be decoded: it is not a {ACCEPTED} file (the formats "
                              f"accepted)") from None
    except PILImage.DecompressionBombError as exc:
        pixels = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{pixels.group(1)} pixels" if pixels else "larger than PIL's decompression-bomb limit"
        raise InvalidArgument(f"{part.where}: image is {size}; at most {limits.max_image_pixels}") from None
    except Exception as exc:  # PIL raises many types for corrupt files (OSError, SyntaxError, ValueError...)
        # PIL's messages name its in-memory file object ("<_io.BytesIO object at 0x...>"): not the caller's
        detail = re.sub(r"<_io\.\w+ object at 0x[0-9a-f]+>", "the image data", str(exc))[:200]
        raise InvalidArgument(f"{part.where}: image cannot be decoded ({type(exc).__name__}: {detail})") from None


def _check_size(n: int, part: Image, limits: Limits) -> None:
    if n > limits.max_image_bytes:
        raise InvalidArgument(f"{part.where}: image is {n} bytes; at most {limits.max_image_bytes}")


def _from_data_url(url: str, part: Image, limits: Limits) -> bytes:
    match = _DATA_URL.match(url)
    if match is None:
        raise InvalidArgument(f"{part.where}: image url must be a 'data:image/...;base64,' URL (remote URLs are "
                              f"not fetched), got {url[:40]!r}")
    payload = url[match.end():]
    _check_size(len(payload) * 3 // 4, part, limits)  # bound the decoded size before decoding
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"{part.where}: image data URL is not valid base64: {exc}") from None


def _from_path(path: str, part: Image, limits: Limits) -> bytes:
    if limits.allowed_media_dir is None:
        raise FailedPrecondition(f"{part.where}: local image paths are disabled; start the preprocessor with "
                                 f"--allowed-media-dir to allow them")
    if "\x00" in path:  # (the OS cannot name such a file: os calls raise ValueError, not OSError)
        raise InvalidArgument(f"{part.where}: image path {path[:80]!r} contains a NUL character")
    root = Path(os.path.realpath(limits.allowed_media_dir))
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        # realpath resolves every symlink and '..', so a link or traversal out of the root is caught here.
        real = Path(os.path.realpath(candidate))
        if real != root and root not in real.parents:
            raise InvalidArgument(f"{part.where}: image path {path[:200]!r} is outside the allowed media directory")
        if not real.is_file():
            what = "does not exist" if not real.exists() else "is not a regular file"
            raise InvalidArgument(f"{part.where}: image path {path[:200]!r} {what}")
        # O_NOFOLLOW: a symlink swapped in after the check is not followed.
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            _check_size(os.fstat(f.fileno()).st_size, part, limits)
            return f.read(limits.max_image_bytes + 1)
    except OSError as exc:  # a name too long, a loop of links, a file swapped for a link, unreadable
        raise InvalidArgument(f"{part.where}: image path {path[:200]!r} cannot be opened "
                              f"({exc.strerror or type(exc).__name__})") from None


def on_white(img: PILImage.Image) -> PILImage.Image:
    """RGB with any transparency painted onto white, as HF's processors (`do_convert_rgb`) and vLLM do.

    A plain convert("RGB") keeps whatever colour sits under transparent pixels (black, mostly), so a
    transparent picture would mean something else here than under HF or vLLM.
    """
    # Even an RGB picture may carry a transparent colour (a PNG tRNS chunk); HF paints that white too.
    return PILImage.fromarray(convert_to_rgb(img, return_numpy=True))
