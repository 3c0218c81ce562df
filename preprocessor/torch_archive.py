"""torch.save archives (vLLM's prompt_embeds encoding) checked before torch.load sees them.

torch.save writes a zip of STORED (uncompressed) records: the pickle, one record per tensor storage, a few
small metadata records. A zip may also hold deflate-compressed records, and torch.load inflates each whole:
1.4 MB of base64 can declare a 1 GiB storage. So only archives laid out as torch.save lays them out pass, and
nothing is inflated: every record stored, sizes within the caps, and one unambiguous layout (the end record
ends the file, the central directory right before it, each local record where the directory says, in order,
agreeing with it) so that Python's zipfile, which reads it here, and torch's own reader see the same records.
"""

from __future__ import annotations

import io
import re
import struct
import zipfile

from splice.errors import InvalidArgument

# Records other than storages (the pickle, the version and byte-order marks) are a few hundred bytes.
MAX_METADATA_RECORD = 64 * 1024
MAX_RECORDS = 64  # one tensor's archive has 7
_STORAGE = re.compile(r"^[^/]+/data/[^/]+$")  # "<archive>/data/<key>"; ".data/serialization_id" is metadata
_EOCD, _EOCD64, _LOCATOR, _LOCAL = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07", b"PK\x03\x04"
_DESCRIPTOR_MAX = 24  # a data descriptor (zip64 sizes, signature) after a record's data
_ENCRYPTED, _DESCRIBED, _UTF8 = 0x1, 0x8, 0x800


def check_archive(blob: bytes, what: str, max_storage: int) -> None:
    """InvalidArgument (naming `what`) unless `blob` is a torch.save zip whose records are all stored, whose
    storages are each at most `max_storage` bytes and whose layout is unambiguous."""
    cd_offset, count = _directory_bounds(blob, what)
    if count > MAX_RECORDS:
        raise InvalidArgument(f"{what}: the archive holds {count} records; a torch.save'd tensor has about 7")
    try:
        infos = zipfile.ZipFile(io.BytesIO(blob)).infolist()  # reads the central directory only
    except Exception as exc:  # BadZipFile, and whatever else a hostile directory makes zipfile raise
        raise InvalidArgument(f"{what}: not a torch.save zip archive ({type(exc).__name__}: "
                              f"{str(exc)[:200]})") from None
    if len(infos) != count:
        raise InvalidArgument(f"{what}: the central directory lists {len(infos)} records, its end record {count}")
    position, slack = 0, 0  # the next local record begins right after the previous one (and its descriptor)
    for info in sorted(infos, key=lambda i: i.header_offset):
        name = info.filename
        if info.compress_type != zipfile.ZIP_STORED:
            raise InvalidArgument(f"{what}: record {name!r} is compressed (zip method {info.compress_type}); "
                                  f"torch.save stores records uncompressed, and a compressed one could inflate to "
                                  f"far more than was sent: send torch.save's own output")
        if info.flag_bits & _ENCRYPTED or info.compress_size != info.file_size:
            raise InvalidArgument(f"{what}: record {name!r} is encrypted or its sizes disagree")
        cap = max_storage if _STORAGE.match(name) else MAX_METADATA_RECORD
        if info.file_size > cap:
            raise InvalidArgument(f"{what}: record {name!r} is {info.file_size} bytes; at most {cap}")
        if not position <= info.header_offset <= position + slack:
            raise InvalidArgument(f"{what}: record {name!r} is not where the archive's layout puts it (offset "
                                  f"{info.header_offset}, expected {position})")
        position = _local_record(blob, info, what, cd_offset)
        slack = _DESCRIPTOR_MAX if info.flag_bits & _DESCRIBED else 0
    if not position <= cd_offset <= position + slack:
        raise InvalidArgument(f"{what}: bytes between the last record and the central directory")


def _directory_bounds(blob: bytes, what: str) -> tuple[int, int]:
    """(central directory offset, record count) from the end record, which must end the file (no comment); with
    zip64, its end record and locator sit between the directory and the end record, and the two agree (readers
    differ in which they believe)."""
    end = len(blob) - 22
    if end < 0 or blob[end:end + 4] != _EOCD:
        raise InvalidArgument(f"{what}: not a torch.save zip archive (no end record at the end of the data)")
    disk, cd_disk, here, count, cd_size, cd_offset, comment = struct.unpack("<HHHHIIH", blob[end + 4:])
    if disk or cd_disk or here != count or comment:
        raise InvalidArgument(f"{what}: a multi-disk zip or one with a comment is not a torch.save archive")
    if end >= 20 + 56 and blob[end - 20:end - 16] == _LOCATOR:
        _, record, disks = struct.unpack("<IQI", blob[end - 16:end])
        if record != end - 20 - 56 or disks != 1 or blob[record:record + 4] != _EOCD64:
            raise InvalidArgument(f"{what}: the zip64 end record is not right before its locator")
        classic = (count, cd_size, cd_offset)
        size, _, _, disk, cd_disk, here, count, cd_size, cd_offset = struct.unpack("<QHHIIQQQQ",
                                                                                  blob[record + 4:record + 56])
        if size != 44 or disk or cd_disk or here != count or any(
                old not in (new, 0xFFFF if i == 0 else 0xFFFFFFFF)
                for i, (old, new) in enumerate(zip(classic, (count, cd_size, cd_offset), strict=True))):
            raise InvalidArgument(f"{what}: a zip64 end record that torch.save does not write")
        end = record
    if cd_offset + cd_size != end:
        raise InvalidArgument(f"{what}: the central directory does not end where the end record begins")
    return cd_offset, count


def _local_record(blob: bytes, info: zipfile.ZipInfo, what: str, limit: int) -> int:
    """The end of `info`'s data, after checking its local header against the central directory."""
    at = info.header_offset
    if at + 30 > limit or blob[at:at + 4] != _LOCAL:
        raise InvalidArgument(f"{what}: record {info.filename!r} has no local header where the directory says")
    flags, method, csize, usize, name_len, extra_len = struct.unpack("<2xHH8xIIHH", blob[at + 4:at + 30])
    raw_name = info.orig_filename.encode("utf-8" if info.flag_bits & _UTF8 else "cp437")
    sizes_agree = flags & _DESCRIBED or csize == usize == 0xFFFFFFFF or csize == usize == info.file_size
    if (flags != info.flag_bits or method != info.compress_type or not sizes_agree
            or blob[at + 30:at + 30 + name_len] != raw_name):
        raise InvalidArgument(f"{what}: record {info.filename!r}'s local header disagrees with the directory")
    data_end = at + 30 + name_len + extra_len + info.file_size
    if data_end > limit:
        raise InvalidArgument(f"{what}: record {info.filename!r} runs past the central directory")
    return data_end
