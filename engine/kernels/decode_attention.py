"""The bfloat16 decode attention kernel (decode_attention.c): one query position per row against keys and values
read where they lie in the slot buffers, in one pass, float32 arithmetic rounded as torch's CPU flash kernel rounds.

Why a kernel: torch's ops for it (two batched matrix products and a softmax, engine/models/attention.py
decode_attention) copy each row's keys and values out of the slot buffers and then run oneDNN products three query
heads deep, which reach a third of this CPU's memory bandwidth; its SDPA (a flash kernel tiled for many queries) and
flex_attention on the CPU cost 4x more at one position, and inductor's fused reduction no less. Measured on SmolLM2's
shapes (30 layers, 320 columns, the buffers cold), bfloat16 on AVX-512 BF16: 16 rows 21 -> 12 ms, 64 rows 90-99 -> 42
ms, 1 row 4-7 -> 1-1.8 ms; on AVX2 (no BF16 units, where torch's bfloat16 products cost ~10x float32's): 16 rows 135 ->
17 ms, 64 rows ~66 ms, 1 row 8 -> 1.8 ms.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from engine.kernels.build import function

SOURCE = Path(__file__).with_name("decode_attention.c")
MAX_HEAD_DIM = 256  # head dims served: multiples of 16 up to this


@functools.cache
def _entry() -> ctypes._CFuncPtr | None:
    """None: no kernel on this host (no gcc, or neither AVX2 nor AVX-512)."""
    c_long, ptr = ctypes.c_long, ctypes.c_void_p
    return function(SOURCE, "splice_decode_attention_bf16",
                    [ptr, c_long, c_long, ptr, c_long, c_long, c_long, ptr, c_long, c_long, c_long, ptr, c_long, ptr,
                     c_long, c_long, c_long, c_long, c_long, ctypes.c_float], "splice_decode_attention_serves")


def prepare() -> bool:
    """Builds (or loads) the kernel now, so that an engine's first request does not; whether it is there."""
    return _entry() is not None


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
           scaling: float | None, groups: int) -> torch.Tensor | None:
    """query [rows, heads, 1, d], key/value [rows, kv_heads, T, d] (views of the slot buffers), mask [rows, 1, 1, >= T]
    bool (True = attend) or None -> [rows, 1, heads, d]; None where the kernel does not serve these tensors (another
    dtype or device, d not a multiple of 16 up to 256, an additive or per-head mask, no kernel on this host)."""
    rows, heads, q, d = query.shape
    kv_heads, t = key.shape[1], key.shape[2]
    if (q != 1 or query.device.type != "cpu" or not query.dtype == key.dtype == value.dtype == torch.bfloat16
            or d % 16 or d > MAX_HEAD_DIM or t < 1 or heads != kv_heads * groups
            or query.stride(3) != 1 or key.stride(3) != 1 or value.stride(3) != 1):
        return None
    if mask is not None:
        if mask.dtype != torch.bool or mask.shape[1] != 1 or mask.shape[2] != 1 or mask.shape[3] < t:
            return None
        mask = mask[:, 0, 0, :t].expand(rows, t)
        if mask.stride(1) != 1:
            return None
    fn = _entry()
    if fn is None:
        return None
    out = torch.empty(rows, 1, heads, d, dtype=query.dtype)
    rc = fn(query.data_ptr(), query.stride(0), query.stride(1), key.data_ptr(), key.stride(0), key.stride(1),
            key.stride(2), value.data_ptr(), value.stride(0), value.stride(1), value.stride(2),
            None if mask is None else mask.data_ptr(), 0 if mask is None else mask.stride(0), out.data_ptr(),
            rows, kv_heads, groups, d, t, d ** -0.5 if scaling is None else scaling)
    return out if rc == 0 else None
