"""The linear layers of Splice's own text forward (engine/models/lean_llama.py) and of the logits: each weight packed
once, at load, for the device's fastest matrix multiply.

Why: on the CPU, F.linear hands the weight to a GEMM that reads it in its plain layout at every call. At decode sizes
(a few rows against a weight of megabytes) and for the vocabulary projection (SmolLM2: 49152 x 576, 113 MB in float32,
read at every step) that costs up to twice what the same GEMM costs on a weight laid out once in the GEMM's own
blocked format. vLLM's CPU path packs every linear once for oneDNN (`create_onednn_mm`); torch ships the same
primitive as `mkldnn._linear_pointwise` over a weight packed by `mkldnn._reorder_linear_weight` (what inductor's CPU
freezing pass emits), in float32 and, on CPUs with AVX-512 BF16 or AMX, bfloat16. On cuda, F.linear (cuBLAS) needs no
packing: the weight is used as it is. Elsewhere (no oneDNN, another dtype) F.linear too.

Numerics: oneDNN's kernels sum in another order than MKL's (float32: within ~1e-5 relative), so logits are not bit-
identical to transformers' modules on the CPU; greedy tokens equal HF's generate (tests/engine/test_families.py).
bfloat16 on a CPU without BF16 units (AVX2 only, or AVX-512 without its BF16 extension): oneDNN has no bfloat16
kernel there and torch's fallback costs ~10x the float32 product (64 rows x 576 -> 1536: 13.9 vs 1.4 ms, one thread,
AVX2). The weight is packed as float32 instead, its exact values (a bfloat16 value is a float32 one), and each product
takes the bfloat16 input widened and rounds its float32 sums back to bfloat16: the products of two bfloat16 values
are exact in float32, so this is the arithmetic of a bfloat16 GEMM that accumulates in float32 (torch's and
oneDNN's), summed in another order. The weight then takes twice the memory, and a step of one row, bound by memory,
streams twice the bytes: one or two rows are multiplied instead by a kernel that reads a bfloat16 copy of the weight
(engine/kernels/small_rows.py) and sums exactly as oneDNN's float32 product does (bit for bit), so the weight is
held three times over (bfloat16, its float32 copy, the kernel's copy: 8 bytes a parameter).

`SPLICE_PACKED_LINEAR=0` turns packing off (F.linear everywhere, bit-identical to transformers' modules), for
comparisons (tests/engine/test_lean_llama.py, bench/lean_forward.py).

Memory: oneDNN makes a primitive for each (rows, weight shape) it multiplies, and keeps it in two caches, its own
(ONEDNN_PRIMITIVE_CACHE_CAPACITY) and ideep's (LRU_CACHE_CAPACITY), 1024 entries each by default, ~0.5 MB an entry at
SmolLM2's shapes. Every distinct row count of a step (a prompt's chunk beside n decoding rows) is a new entry: an
engine serving prompts of varied lengths kept up to ~460 MB more with those defaults, never returned.
`bound_primitive_caches` lowers both to PRIMITIVE_CACHE_ENTRIES before the first primitive is made (where the
environment does not set them). A miss costs ~1 ms per weight shape (SmolLM2: 0.7-1.1 ms; its vocabulary projection
2-17 ms) and is rare: 16 streams of prompts of 20-1,500 positions replayed against an LRU of these entries made 214
distinct primitives and missed 241 times at 64 entries, 235 at 128, 214 at 1024 (so 64 entries cost ~6 misses more
than 128 in a run of 108 s, and ~27 more than no eviction at all); 64 streams of 20-1,000 positions, whose decode
batches shrink and grow: 371 distinct, 608 misses at 64, 483 at 128 (125 more over 621 steps and 267 s: < 0.2 s).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from engine.kernels import small_rows

# The batch size oneDNN's packed layout is chosen for; vLLM's CPU path uses 32 (its layout serves every row count).
PACK_ROWS = 32
PACKED_DTYPES = (torch.float32, torch.bfloat16)
PRIMITIVE_CACHE_ENTRIES = 64  # per cache: ~30 MB at most at SmolLM2's shapes (see the module's docstring)
PRIMITIVE_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's: read at first use


def packing_enabled() -> bool:
    return os.environ.get("SPLICE_PACKED_LINEAR", "1") != "0"


def can_pack(weight: torch.Tensor) -> bool:
    """A 2-D CPU weight oneDNN multiplies packed: float32, or bfloat16 (as float32 where the CPU has no BF16 units)."""
    if not packing_enabled() or weight.device.type != "cpu" or weight.dim() != 2 or weight.dtype not in PACKED_DTYPES:
        return False
    return torch.backends.mkldnn.is_available()


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX-512 BF16, AMX, Arm's BF16): oneDNN's own test."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def native_half(dtype: torch.dtype) -> bool:
    """Whether this CPU multiplies `dtype` (bfloat16 or float16) in hardware, as oneDNN tests it."""
    if dtype == torch.bfloat16:
        return native_bf16()
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_fp16_supported()


def bound_primitive_caches() -> None:
    """oneDNN's and ideep's primitive caches hold PRIMITIVE_CACHE_ENTRIES each, unless the environment says otherwise;
    effective when called before the process's first oneDNN primitive (a Linear's packing is the engine's)."""
    for name in PRIMITIVE_CACHES:
        os.environ.setdefault(name, str(PRIMITIVE_CACHE_ENTRIES))


class Linear:
    """y = x W^T + b with W [out, in] packed once where the device has a packed GEMM (see the module's docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.detach()  # kept: the fallback, and what callers read the shape and dtype of
        self.bias = bias.detach() if bias is not None else None
        bound_primitive_caches()
        self.packed = self.packed_bias = None
        # bfloat16 multiplied as float32 where the CPU has no BF16 units (the module's docstring says why)
        self.widened = self.weight.dtype == torch.bfloat16 and self.weight.device.type == "cpu" and not native_bf16()
        self.blocked = None  # the bfloat16 weight as engine/kernels/small_rows.py reads it (widened only)
        if can_pack(self.weight):
            work = self.weight.float() if self.widened else self.weight
            self.packed = torch.ops.mkldnn._reorder_linear_weight(work, PACK_ROWS)
            self.packed_bias = self.bias.to(work.dtype) if self.bias is not None else None
            if self.widened:
                self.blocked = small_rows.blocked(self.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        if self.packed is None or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        if self.widened:
            wide = x.float()
            if self.blocked is not None:  # one or two rows: the bfloat16 weight read (half the bytes)
                few = small_rows.product(wide.reshape(-1, wide.shape[-1]), self.blocked, self.packed_bias)
                if few is not None:
                    return few.reshape(*x.shape[:-1], few.shape[-1]).to(x.dtype)
            return self._product(wide).to(x.dtype)
        return self._product(x)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        wide = _product_threads
        if wide is None or (usual := torch.get_num_threads()) >= wide:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.packed_bias, "none", [], "")
        torch.set_num_threads(wide)
        try:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.packed_bias, "none", [], "")
        finally:
            torch.set_num_threads(usual)


_product_threads: int | None = None  # torch threads for a packed product; None: the caller's (product_threads)


def product_threads(n: int | None) -> None:
    """Every packed product from now on runs on at least `n` torch threads (None: on the caller's count), the
    caller's count restored after it: engine/step_threads.py says why. Process-wide, as torch's threads are."""
    global _product_threads
    _product_threads = n
