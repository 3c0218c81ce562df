"""Crafted hostile files, small on the wire and huge once decoded (a decompression bomb of each kind the
preprocessor decodes): a torch.save archive whose deflated storage declares a GiB, a PNG of 16,000,000 x 1 pixels,
EPS (which Pillow would hand to Ghostscript). The tests send them; fuzz_decoders.py seeds its mutations with them.
Nothing of the declared size is allocated while they are made."""

from __future__ import annotations

import io
import struct
import warnings
import zipfile
import zlib

import torch


def torch_save(obj: object) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, buf)
    return buf.getvalue()


def deflated_torch_save(shape: tuple[int, int] = (4, 64), declared: int = 1 << 30) -> bytes:
    """A torch.save archive whose float32 storage declares `declared` bytes (a multiple of 1 MiB) under a
    `shape` view: its record is deflate-compressed zeros, about 1 KB per MB, so 1 GiB takes about 1 MB.
    Nothing of that size is allocated here: one MiB is compressed and its stream repeated."""
    n = shape[0] * shape[1]
    src = zipfile.ZipFile(io.BytesIO(torch_save(torch.zeros(n + 1)[:n].view(*shape))))
    records = []
    for info in src.infolist():
        data = src.read(info)
        if info.filename.endswith("/data/0"):
            records.append((info.filename, zipfile.ZIP_DEFLATED, *_deflated_zeros(declared)))
            continue
        if info.filename.endswith("/data.pkl"):  # the storage's element count: n + 1 -> declared / 4
            old = b"M" + struct.pack("<H", n + 1) if n + 1 < 1 << 16 else b"J" + struct.pack("<i", n + 1)
            assert data.count(old) == 1
            data = data.replace(old, b"J" + struct.pack("<i", declared // 4))
        records.append((info.filename, zipfile.ZIP_STORED, data, zlib.crc32(data), len(data)))
    return write_zip(records)


def _deflated_zeros(size: int) -> tuple[bytes, int, int]:
    """(raw deflate stream, crc32, size) of `size` zero bytes. A full flush ends each MiB's blocks and forgets the
    history, so every MiB compresses to the same bytes."""
    mib = bytes(1 << 20)
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = z.compress(mib) + z.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(mib, crc)
    return block * (size >> 20) + z.flush(), crc, size


def write_zip(records: list[tuple[str, int, bytes, int, int]]) -> bytes:
    """A plain zip of (name, method, payload as stored, crc32, uncompressed size) records, no zip64."""
    out, central = bytearray(), bytearray()
    for name, method, payload, crc, size in records:
        raw = name.encode()
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(payload), size,
                               len(raw), 0, 0, 0, 0, 0, len(out)) + raw
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(payload), size, len(raw), 0)
        out += raw + payload
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(records), len(records), len(central), len(out), 0)
    return bytes(out + central + end)


def png_header_only(width: int, height: int, bit_depth: int = 1, color: int = 0) -> bytes:
    """A PNG of `width` x `height` (e.g. 16,000,000 x 1) whose one IDAT holds rows of zeros: a few KB
    for a grayscale 1-bit image however wide (zlib at about 1000:1)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = 1 + (width * bit_depth + 7) // 8  # filter byte + packed samples
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(bytes(row)) for _ in range(height)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n%%EndComments\nshowpage\n%%EOF\n"
