"""Tensors on the wire: raw little-endian bytes + dtype name + shape (splice.v1.Tensor)."""

from __future__ import annotations

import math
import sys

import torch

from splice.errors import InvalidArgument
from splice.v1 import common_pb2

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})


def dtype_from_name(name: str, what: str = "tensor") -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise InvalidArgument(f"{what}: unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise InvalidArgument(f"unsupported dtype {dtype}") from None


def nbytes_of(dtype: torch.dtype, shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def byte_view(t: torch.Tensor) -> memoryview:
    """Little-endian C-contiguous bytes of `t` as a flat memoryview; no copy when `t` is a contiguous CPU tensor."""
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
        raise RuntimeError("big-endian hosts are not supported")
    t = t.detach().to("cpu").contiguous().reshape(-1)
    if t.numel() == 0:
        return memoryview(b"")
    # numpy has no bfloat16: every dtype goes through its bytes
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def to_bytes(t: torch.Tensor) -> bytes:
    """Little-endian C-contiguous bytes of a CPU copy of `t`."""
    return bytes(byte_view(t))


def from_bytes(data: bytes | bytearray | memoryview, dtype: torch.dtype, shape: tuple[int, ...] | list[int],
               what: str = "tensor") -> torch.Tensor:
    """The tensor of `data`; checks the byte count against dtype and shape first. A writable buffer (bytearray,
    an assembled upload) is viewed without a copy and shared; read-only bytes are copied once."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"{what}: negative dimension in shape {list(shape)}")
    expected = nbytes_of(dtype, shape)
    if len(data) != expected:
        raise InvalidArgument(
            f"{what}: {len(data)} bytes for dtype {dtype_name(dtype)} shape {list(shape)}, expected {expected}")
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    if isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly):
        data = bytearray(data)  # frombuffer needs a writable buffer, and the tensor must own it
    return torch.frombuffer(data, dtype=dtype).reshape(shape)


def tensor_to_pb(t: torch.Tensor) -> common_pb2.Tensor:
    return common_pb2.Tensor(dtype=dtype_name(t.dtype), shape=list(t.shape), data=to_bytes(t))


def tensor_from_pb(pb: common_pb2.Tensor, what: str = "tensor") -> torch.Tensor:
    return from_bytes(pb.data, dtype_from_name(pb.dtype, what), list(pb.shape), what)
