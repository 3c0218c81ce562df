"""One or two rows times a bfloat16 weight on a CPU without BF16 units (small_rows_bf16.c): the weight read as
bfloat16 and widened in registers, with the very sums of engine/models/linear.py's widened path (oneDNN's float32
product of the weight's float32 copy), bit for bit.

Why a kernel: there the widened path multiplies the weight's float32 copy, so a decode step of one row streams twice
the bytes the bfloat16 weight holds (SmolLM2: 540 MB instead of 270), and a step of one row is bound by memory. The
kernel reads a copy of the bfloat16 weight blocked by eight outputs (`blocked`, made once at load), so that each
output's sum runs along the inputs in order, as oneDNN's does.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.kernels.build import function

SOURCE = Path(__file__).with_name("small_rows_bf16.c")
MAX_ROWS = 2  # rows served (from three, oneDNN's float32 product on two threads is as fast)
LANES = 8  # outputs a block holds


@functools.cache
def _entry() -> ctypes._CFuncPtr | None:
    """None: no kernel on this host (no gcc, or no AVX2 + FMA)."""
    c_long, ptr = ctypes.c_long, ctypes.c_void_p
    return function(SOURCE, "splice_small_rows_bf16", [ptr, c_long, ptr, ptr, ptr, c_long, c_long, c_long, c_long],
                    "splice_small_rows_serves")


def prepare() -> bool:
    """Builds (or loads) the kernel now, so that an engine's first request does not; whether it is there."""
    return _entry() is not None


def blocked(weight: torch.Tensor) -> torch.Tensor | None:
    """weight [out, in] bfloat16 on the CPU -> its copy as the kernel reads it, [out / 8, in, 8]; None where the
    kernel would not serve it (out not a multiple of 8, another dtype or device, no kernel on this host)."""
    if (weight.dim() != 2 or weight.dtype != torch.bfloat16 or weight.device.type != "cpu"
            or weight.shape[0] % LANES or not prepare()):
        return None
    out, inputs = weight.shape
    return weight.reshape(out // LANES, LANES, inputs).transpose(1, 2).contiguous()


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """x [rows, in] float32, `weight` a `blocked` one, bias [out] float32 or None -> x W^T + bias [rows, out] float32;
    None for more than MAX_ROWS rows (or rows whose inputs are not adjacent)."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or x.stride(1) != 1:
        return None
    blocks, inputs, _ = weight.shape  # (contiguous: `blocked` made it)
    if x.dtype != torch.float32 or x.shape[1] != inputs:
        raise ValueError(f"small_rows.product: x {tuple(x.shape)} {x.dtype} against a blocked weight "
                         f"{tuple(weight.shape)}")
    rows, out = x.shape[0], blocks * LANES
    y = torch.empty(rows, out, dtype=torch.float32)
    rc = _entry()(x.data_ptr(), x.stride(0), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                  y.data_ptr(), out, rows, inputs, out)
    return y if rc == 0 else None
