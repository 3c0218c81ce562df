"""Images by bytes, data: URL and allowed path; caps, corrupt files and path escapes are rejected."""

from __future__ import annotations

import base64
import io
import os

import pytest
from PIL import Image as PILImage

from preprocessor.content import Image, Where
from preprocessor.core import PreprocessorCore
from preprocessor.images import load_image
from preprocessor.limits import Limits
from splice.errors import SpliceError
from tests.preprocessor.pp_factories import conversation, png_bytes

WHERE = Where(0, 1)


def _reject(part: Image, limits: Limits, code: str = "INVALID_ARGUMENT") -> str:
    with pytest.raises(SpliceError) as exc:
        load_image(part, limits)
    assert exc.value.code == code
    assert "messages[0].content[1]" in exc.value.message
    return exc.value.message


def _data_url(blob: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(blob).decode()


def test_sources_decode_to_the_same_rgb_image(tmp_path):
    blob = png_bytes(20, 10)
    (tmp_path / "a.png").write_bytes(blob)
    limits = Limits(allowed_media_dir=tmp_path)
    expected = PILImage.open(io.BytesIO(blob)).convert("RGB")
    for part in (Image("data", blob, WHERE), Image("url", _data_url(blob), WHERE),
                 Image("path", "a.png", WHERE), Image("path", str(tmp_path / "a.png"), WHERE)):
        got = load_image(part, limits)
        assert got.mode == "RGB" and got.tobytes() == expected.tobytes(), part.source


def test_rgba_and_grayscale_become_rgb():
    for mode in ("RGBA", "L", "P"):
        buf = io.BytesIO()
        PILImage.new(mode, (8, 8)).save(buf, format="PNG")
        assert load_image(Image("data", buf.getvalue(), WHERE), Limits()).mode == "RGB"


def test_corrupt_image_rejected():
    message = _reject(Image("data", b"\x89PNG\r\n\x1a\nnot really", WHERE), Limits())
    assert "cannot be decoded" in message and "0x" not in message  # no internal object addresses
    truncated = png_bytes(40, 40)[:60]
    assert "cannot be decoded" in _reject(Image("data", truncated, WHERE), Limits())


def test_empty_image_rejected():
    assert "empty" in _reject(Image("data", b"", WHERE), Limits())


def test_pixel_cap_checked_from_header():
    msg = _reject(Image("data", png_bytes(70, 45), WHERE), Limits(max_image_pixels=1000))
    assert "70x45" in msg and "at most 1000" in msg


def test_byte_cap():
    blob = png_bytes(70, 45)
    assert "at most 100" in _reject(Image("data", blob, WHERE), Limits(max_image_bytes=100))
    assert "at most 100" in _reject(Image("url", _data_url(blob), WHERE), Limits(max_image_bytes=100))


@pytest.mark.parametrize("url", ["http://example.com/a.png", "file:///etc/passwd", "data:text/plain;base64,QQ=="])
def test_only_data_image_urls(url):
    assert "data:image/" in _reject(Image("url", url, WHERE), Limits())


def test_bad_base64_data_url():
    assert "not valid base64" in _reject(Image("url", "data:image/png;base64,@@@", WHERE), Limits())


def test_paths_disabled_by_default():
    msg = _reject(Image("path", "/etc/hosts", WHERE), Limits(), code="FAILED_PRECONDITION")
    assert "--allowed-media-dir" in msg


def test_path_traversal_rejected(tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    (tmp_path / "secret.png").write_bytes(png_bytes())
    limits = Limits(allowed_media_dir=root)
    for path in ("../secret.png", str(tmp_path / "secret.png"), "sub/../../secret.png"):
        assert "outside the allowed media directory" in _reject(Image("path", path, WHERE), limits)


def test_symlink_out_of_root_rejected(tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    (tmp_path / "secret.png").write_bytes(png_bytes())
    os.symlink(tmp_path / "secret.png", root / "link.png")
    os.symlink(tmp_path, root / "dirlink")
    limits = Limits(allowed_media_dir=root)
    assert "outside" in _reject(Image("path", "link.png", WHERE), limits)
    assert "outside" in _reject(Image("path", "dirlink/secret.png", WHERE), limits)


def test_symlink_inside_root_allowed(tmp_path):
    (tmp_path / "real.png").write_bytes(png_bytes(5, 5))
    os.symlink(tmp_path / "real.png", tmp_path / "alias.png")
    assert load_image(Image("path", "alias.png", WHERE), Limits(allowed_media_dir=tmp_path)).size == (5, 5)


def test_missing_file_and_directory_rejected(tmp_path):
    (tmp_path / "d").mkdir()
    limits = Limits(allowed_media_dir=tmp_path)
    assert "does not exist" in _reject(Image("path", "nope.png", WHERE), limits)
    assert "not a regular file" in _reject(Image("path", "d", WHERE), limits)


def test_images_on_a_text_model_fail_precondition(tiny):
    files, info = tiny["tiny-text"]
    with pytest.raises(SpliceError) as exc:
        PreprocessorCore(files, info).normalize_chat(conversation(("user", ["look", png_bytes(), "hi"])))
    assert exc.value.code == "FAILED_PRECONDITION" and "does not accept images" in exc.value.message
    assert "messages[0].content[1]" in exc.value.message  # names the part


def test_too_many_images(tiny):
    files, info = tiny["tiny-llava"]
    core = PreprocessorCore(files, info, limits=Limits(max_images=1))
    with pytest.raises(SpliceError) as exc:
        core.normalize_chat(conversation(("user", [png_bytes(), png_bytes(), "hi"])))
    assert exc.value.code == "INVALID_ARGUMENT" and "2 images; at most 1" in exc.value.message


def test_decompression_bomb_cites_splices_pixel_cap():
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    # A header claiming 30000 x 30000 (900M pixels, past twice PIL's own limit) over almost no data.
    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(b"\0" * 100)) + chunk(b"IEND", b"")
    message = _reject(Image("data", bomb, WHERE), Limits())
    assert f"at most {Limits().max_image_pixels}" in message and "900000000 pixels" in message
    assert "PIL" not in message and "DOS" not in message


def test_empty_content_names_its_message():
    from preprocessor.content import Message

    with pytest.raises(SpliceError) as exc:
        Message("user", (), False, 3)
    assert exc.value.code == "INVALID_ARGUMENT" and "messages[3]" in exc.value.message


def test_nul_and_overlong_paths_refused(tmp_path):
    limits = Limits(allowed_media_dir=tmp_path)
    assert "NUL" in _reject(Image("path", "a.png\x00.txt", WHERE), limits)
    assert "cannot be opened" in _reject(Image("path", "a" * 300 + ".png", WHERE), limits)


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n%%EndComments\nshowpage\n%%EOF\n"


def test_only_the_accepted_formats_are_parsed(monkeypatch):
    from PIL import EpsImagePlugin

    opened = []
    real_open = EpsImagePlugin.EpsImageFile._open
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", lambda self: (opened.append(1), real_open(self)))
    assert "not a PNG, JPEG, WebP, GIF or BMP file" in _reject(Image("data", EPS, WHERE), Limits())
    assert not opened  # Pillow's EPS parser never saw the bytes
    buf = io.BytesIO()
    PILImage.new("RGB", (4, 4)).save(buf, format="TIFF")
    assert "not a PNG, JPEG, WebP, GIF or BMP file" in _reject(Image("data", buf.getvalue(), WHERE), Limits())
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP"):
        buf = io.BytesIO()
        PILImage.new("RGB", (6, 4), (200, 10, 10)).save(buf, format=fmt)
        assert load_image(Image("data", buf.getvalue(), WHERE), Limits()).size == (6, 4), fmt


@pytest.fixture
def no_decoding(monkeypatch):
    """Counts Pillow's pixel decoding (ImageFile.load): a refusal from the header must leave it at 0."""
    from PIL import ImageFile

    calls = []
    real = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: (calls.append(1), real(self))[1])
    return calls


def test_side_and_aspect_ratio_checked_from_the_header(no_decoding):
    from tests.harness.hostile_files import png_header_only

    msg = _reject(Image("data", png_header_only(16_000_000, 1), WHERE), Limits())
    assert "16000000x1" in msg and "at most 8192 pixels (--max-image-side)" in msg
    msg = _reject(Image("data", png_header_only(4000, 10), WHERE), Limits())
    assert "4000x10, 400 times as long as it is wide; at most 200 (--max-image-aspect-ratio)" in msg
    assert "--max-image-side" in _reject(Image("data", png_header_only(100, 50), WHERE), Limits(max_image_side=99))
    assert not no_decoding
    assert load_image(Image("data", png_header_only(2000, 10), WHERE), Limits()).size == (2000, 10)  # 200: allowed


def test_a_requests_pixels_are_checked_together_before_decoding(tiny, no_decoding):
    from tests.harness.hostile_files import png_header_only

    files, info = tiny["tiny-llava"]
    core = PreprocessorCore(files, info, limits=Limits(max_request_image_pixels=3 * 100 * 100))
    four = conversation(("user", [png_header_only(100, 100)] * 4 + ["hi"]))
    with pytest.raises(SpliceError) as exc:
        core.normalize_chat(four)
    assert exc.value.code == "INVALID_ARGUMENT" and "4 images have 40000 pixels together; at most 30000" in \
        exc.value.message
    assert not no_decoding
    assert core.normalize_chat(conversation(("user", [png_header_only(100, 100)] * 3 + ["hi"]))).request.tensors


def test_decoding_is_charged_to_the_requests_admission(tiny):
    from preprocessor.admission import Admission
    from preprocessor.images import DECODED_BYTES_PER_PIXEL
    from tests.harness.hostile_files import png_header_only

    files, info = tiny["tiny-llava"]
    core = PreprocessorCore(files, info)
    blob = png_header_only(300, 200)
    admission = Admission(max_bytes=4 << 20)
    ticket = admission.enter(1000)  # as the call guard does: this context's request
    core.normalize_chat(conversation(("user", [blob, blob, "hi"])))
    assert admission.held == 1000 + DECODED_BYTES_PER_PIXEL * 3 * 60000 + 2 * len(blob)
    ticket.release()
    assert admission.held == 0
    core.normalize_chat(conversation(("user", [blob, "hi"])))  # a released ticket is charged nothing
    assert admission.held == 0
    ticket = admission.enter(1000)
    try:
        with pytest.raises(SpliceError) as exc:  # more than the cap by itself: it can never fit
            core.normalize_chat(conversation(("user", [png_header_only(600, 600)] * 2 + ["hi"])))
        assert exc.value.code == "RESOURCE_EXHAUSTED" and "more than the 4194304 request bytes" in exc.value.message
        assert admission.held == 1000
    finally:
        ticket.release()
