"""prompt_embeds (and image_embeds) decoding: raw tensor, vLLM's base64(torch.save), safetensors -> [n, hidden] rows.

Every size is checked against the cap from metadata (dtype x shape) before the dense tensor is
allocated. A torch.save archive is checked before torch.load reads it (torch_archive.py: stored records only,
none over the cap), then loaded on the meta device, from its pickle alone, so that a tensor whose storage is
smaller than its view (an expand of a small one) is refused before any storage is read.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import struct
import warnings
from collections.abc import Callable

import torch

from preprocessor.admission import charge
from preprocessor.content import Embeds, RawTensor
from preprocessor.limits import Limits
from preprocessor.torch_archive import check_archive
from splice.errors import InvalidArgument
from splice.model_info import ModelInfo
from splice.request_rules import all_finite, check_finite, check_float_dtype, check_hidden
from splice.request_rules import check_rows as check_context_rows
from splice.tensors import DTYPES, dtype_from_name, from_bytes

SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
MAX_SAFETENSORS_HEADER = 1 << 20
# torch.save adds a zip container and pickled metadata around the storage bytes.
TORCH_SAVE_OVERHEAD = 64 * 1024
# torch.load warns of a pickle protocol it was not written with, naming it: a caller could fill the log with them.
warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)


# Checks the rows of a tensor from its header, before it is allocated (InvalidArgument naming what they should be).
RowsCheck = Callable[[int], None]


def decode_embeds(part: Embeds, info: ModelInfo, limits: Limits, check_rows: RowsCheck | None = None) -> torch.Tensor:
    """[n, hidden] rows in the engine's dtype, validated (float, shape, finite, size; `check_rows(n)` too)."""
    if part.encoding == "tensor":
        tensor = _from_raw(part.payload, part, info, limits, check_rows)
    elif part.encoding == "torch_base64":
        tensor = _from_torch_base64(part.payload, part, info, limits, check_rows)
    else:
        tensor = _from_safetensors(part.payload, part, info, limits, check_rows)
    return _normalize(tensor, part, info)


def _check_meta(dtype: torch.dtype, shape: tuple[int, ...], part: Embeds, info: ModelInfo, limits: Limits,
                check_rows: RowsCheck | None = None) -> None:
    """dtype and shape checks that need no allocation: a few bytes of header must not make us allocate
    more than the engine could ever take. Every encoding passes here, so the rows and hidden size of what
    it decodes are settled."""
    what = f"{part.where}: {part.label}"
    check_float_dtype(dtype, what)
    if len(shape) == 3 and shape[0] != 1:
        raise InvalidArgument(f"{part.where}: {part.label} of shape {list(shape)}: a 3-D tensor must be "
                              f"[1, n, hidden]")
    if len(shape) not in (2, 3):
        raise InvalidArgument(f"{part.where}: {part.label} must be [n, hidden] or [1, n, hidden], got shape "
                              f"{list(shape)}")
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"{part.where}: {part.label} has a negative dimension in {list(shape)}")
    check_hidden(shape[-1], info, what)
    check_context_rows(shape[-2], info, what)
    if check_rows is not None:
        check_rows(shape[-2])
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if size > limits.max_embeds_bytes:
        raise InvalidArgument(f"{part.where}: {part.label} of shape {list(shape)} is {size} bytes; at most "
                              f"{limits.max_embeds_bytes}")


def _charge(dtype: torch.dtype, shape: tuple[int, ...], copies: int, part: Embeds, info: ModelInfo) -> None:
    """Charges the request's admission, before they are allocated, `copies` of the tensor in its own dtype and its
    rows in the engine's (held until the request ends; sent bytes are admitted, what they decode to is not)."""
    n = math.prod(shape)
    engine = dtype_from_name(info.dtype, "engine dtype")
    charge(n * (copies * _itemsize(dtype) + _itemsize(engine)), f"{part.where}: decoding {part.label}")


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _from_raw(raw: RawTensor, part: Embeds, info: ModelInfo, limits: Limits,
              check_rows: RowsCheck | None = None) -> torch.Tensor:
    dtype = dtype_from_name(raw.dtype, f"{part.where}: {part.label}")
    _check_meta(dtype, raw.shape, part, info, limits, check_rows)
    # from_bytes copies read-only bytes (a message's); an assembled upload's buffer was admitted as it arrived
    writable = isinstance(raw.data, bytearray) or (isinstance(raw.data, memoryview) and not raw.data.readonly)
    _charge(dtype, raw.shape, 0 if writable else 1, part, info)
    return from_bytes(raw.data, dtype, raw.shape, f"{part.where}: {part.label}")


def _from_torch_base64(text: str, part: Embeds, info: ModelInfo, limits: Limits,
                       check_rows: RowsCheck | None = None) -> torch.Tensor:
    what = f"{part.where}: {part.label} torch_base64"
    # base64 is 4 characters per 3 bytes: bound the decoded size before decoding.
    if len(text) * 3 // 4 > limits.max_embeds_bytes + TORCH_SAVE_OVERHEAD:
        raise InvalidArgument(f"{what} is {len(text)} characters; the decoded tensor may be at most "
                              f"{limits.max_embeds_bytes} bytes")
    charge(len(text) * 3 // 4, f"{part.where}: decoding {part.label}")  # the archive
    try:
        blob = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"{what} is not valid base64: {exc}") from None
    # Nothing is inflated (stored records only) and no storage is over the cap; then the tensor is built on the
    # meta device first, from the pickle alone, so that its view is checked before any storage is read.
    check_archive(blob, what, limits.max_embeds_bytes)
    view = _check_loaded(load_torch_save(blob, "meta", what), "meta", part, info, limits, check_rows)
    # its storage, read from the archive (a slice's whole storage), and the rows
    charge(view.untyped_storage().nbytes(), f"{part.where}: decoding {part.label}")
    _charge(view.dtype, tuple(view.shape), 0, part, info)
    return _check_loaded(load_torch_save(blob, "cpu", what), "cpu", part, info, limits)


def load_torch_save(blob: bytes, device: str, what: str) -> object:
    # A sparse tensor's indices are checked as it is built with its data (meta has none); it is refused below
    # anyway, but is never left unchecked in memory.
    checks = torch.sparse.check_sparse_tensor_invariants(enable=device != "meta")
    try:
        # weights_only: the unpickler only builds tensors and plain containers, never arbitrary objects.
        with checks:
            return torch.load(io.BytesIO(blob), weights_only=True, map_location=device)
    except Exception as exc:
        raise InvalidArgument(f"{what} is not a torch.save'd dense tensor loadable with weights_only=True "
                              f"({type(exc).__name__}: {str(exc)[:200]})") from None


def _check_loaded(obj: object, device: str, part: Embeds, info: ModelInfo, limits: Limits,
                  check_rows: RowsCheck | None = None) -> torch.Tensor:
    """`obj` as a dense tensor on `device` whose storage is exactly its view. What weights_only=True may still
    build but is not rows of numbers in memory is refused before its shape or data is touched: a nested tensor
    has no shape; a meta tensor, loaded as meta whatever map_location says, has no data."""
    what = f"{part.where}: {part.label} torch_base64"
    if not isinstance(obj, torch.Tensor):
        raise InvalidArgument(f"{what} holds a {type(obj).__name__}, not a tensor")
    if type(obj) not in (torch.Tensor, torch.nn.Parameter) or obj.is_nested:
        kind = "nested tensor" if obj.is_nested else type(obj).__name__
        raise InvalidArgument(f"{what} holds a {kind}; send one dense tensor [n, hidden]")
    if obj.layout != torch.strided:
        raise InvalidArgument(f"{part.where}: {part.label} must be a dense tensor, got layout {obj.layout}")
    if obj.device.type != device:
        raise InvalidArgument(f"{what} holds a tensor on device {obj.device.type!r} (no data); send a tensor "
                              f"with its data")
    _check_meta(obj.dtype, tuple(obj.shape), part, info, limits, check_rows)
    # A stride-0 view (expand) describes more elements than its storage holds: densifying it would turn a few KB
    # into GBs. A view of a larger storage (a slice, as torch.save keeps it) is taken: that storage was sent,
    # stored, within the cap, so it holds no more than the bytes received (and is charged as such).
    if obj.untyped_storage().nbytes() < obj.numel() * obj.element_size():
        raise InvalidArgument(f"{what} is a view of a smaller storage (e.g. expand() of shape {list(obj.shape)}); "
                              f"send a dense tensor (.contiguous())")
    return obj


def _from_safetensors(blob: bytes, part: Embeds, info: ModelInfo, limits: Limits,
                      check_rows: RowsCheck | None = None) -> torch.Tensor:
    what = f"{part.where}: {part.label} safetensors"
    if len(blob) < 8:
        raise InvalidArgument(f"{what}: {len(blob)} bytes is too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > MAX_SAFETENSORS_HEADER or 8 + header_len > len(blob):
        raise InvalidArgument(f"{what}: header length {header_len} is invalid for a {len(blob)}-byte file")
    try:
        header = json.loads(blob[8:8 + header_len])
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{what}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise InvalidArgument(f"{what}: header is not a JSON object")
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if len(entries) != 1:
        raise InvalidArgument(f"{what}: holds {len(entries)} tensors ({sorted(entries)[:8]}); exactly one expected")
    ((name, entry),) = entries.items()
    try:
        st_dtype, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise InvalidArgument(f"{what}: tensor {name!r} has a malformed header entry") from None
    if st_dtype not in SAFETENSORS_DTYPES:
        raise InvalidArgument(f"{what}: tensor {name!r} has unsupported dtype {st_dtype}")
    dtype = DTYPES[SAFETENSORS_DTYPES[st_dtype]]
    _check_meta(dtype, shape, part, info, limits, check_rows)
    _charge(dtype, shape, 2, part, info)  # the slice of the file, and the tensor's own copy of it
    data_start = 8 + header_len
    if not (0 <= begin <= end <= len(blob) - data_start):
        raise InvalidArgument(f"{what}: tensor {name!r} data offsets [{begin}, {end}) fall outside the file")
    return from_bytes(blob[data_start + begin:data_start + end], dtype, shape, what)


def _normalize(tensor: torch.Tensor, part: Embeds, info: ModelInfo) -> torch.Tensor:
    """Shape already checked by _check_meta. Values are checked once, after the cast to the engine's dtype (a
    cast keeps NaN and Inf, and turns overflow into Inf); only a failure looks at the source to say which."""
    if tensor.dim() == 3:
        tensor = tensor[0]  # [1, n, hidden] -> [n, hidden]
    what = f"{part.where}: {part.label}"
    out = tensor.to(dtype_from_name(info.dtype, "engine dtype")).contiguous()  # [n, hidden]
    if out.untyped_storage().nbytes() > out.numel() * out.element_size():
        out = out.clone()  # a slice's rows, without the rest of the storage it came in
    if not all_finite(out):
        check_finite(tensor, what)
        check_finite(out, what, f"they overflow the engine's dtype {info.dtype}")
    return out
