"""engine/models/linear.py: a weight packed once for oneDNN multiplies as F.linear does (float32 and bfloat16;
bfloat16 as float32 sums of its exact values where the CPU has no BF16 units), with and without a bias, for any
leading shape; SPLICE_PACKED_LINEAR=0 keeps F.linear; the served text stacks and vocabulary projections run packed;
and what oneDNN keeps of the row counts it has multiplied stops growing (its primitive caches bounded)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.loader import load
from engine.models import linear
from engine.models.attention import decode_attention
from engine.models.linear import PRIMITIVE_CACHES, Linear, bound_primitive_caches, can_pack
from splice import heap

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_packed_equals_f_linear(dtype, bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if bias else None
    lin = Linear(w, b)
    assert lin.packed is not None
    for shape in ((1, 40), (7, 40), (3, 5, 40)):
        x = torch.randn(*shape, generator=g).to(dtype)
        tol = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.02}
        torch.testing.assert_close(lin(x), F.linear(x, w, b), **tol)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [(2, 9), (1, 1), (2, 1)])
def test_bfloat16_is_its_exact_sums_rounded_once(monkeypatch, native, bias, rows):
    """bfloat16 products accumulate in float32 whether the CPU has BF16 units or not (then the weight is packed as
    float32, and one or two rows read the bfloat16 weight through engine/kernels/small_rows.py): each output is the
    exact sum (float64 here) rounded to bfloat16, give or take the last bit."""
    if native and not linear.native_bf16():
        pytest.skip("no BF16 units on this CPU")
    monkeypatch.setattr(linear, "native_bf16", lambda: native)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 200, generator=g).bfloat16()
    b = torch.randn(64, generator=g).bfloat16() if bias else None
    lin = Linear(w, b)
    assert lin.widened is not native and lin.packed is not None
    assert lin.packed.dtype == (torch.bfloat16 if native else torch.float32)
    x = torch.randn(*rows, 200, generator=g).bfloat16()
    got = lin(x)
    assert got.dtype == torch.bfloat16 and got.shape == (*rows, 64)
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    # one rounding of the exact sum: half a unit in the last place (2^-9 relative); another order of float32 sums
    # moves a value by ~1e-5 here, and so its rounding by up to one unit
    assert ((got.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-4).all()


def test_packing_off_is_f_linear_itself(monkeypatch):
    monkeypatch.setenv("SPLICE_PACKED_LINEAR", "0")
    w = torch.randn(8, 4)
    assert not can_pack(w)
    x = torch.randn(3, 4)
    assert torch.equal(Linear(w)(x), F.linear(x, w))


def test_a_weight_of_another_dtype_or_shape_is_not_packed():
    assert not can_pack(torch.randn(8, 4, dtype=torch.float16))
    assert not can_pack(torch.randn(2, 8, 4))


def test_served_text_stacks_and_heads_run_packed(tiny_dirs):
    family = load(EngineConfig(model=str(tiny_dirs["tiny-text"]))).family
    assert family.impl == "splice"
    layer = family.backbone.layers[0]
    assert all(lin.packed is not None for lin in (layer.qkv, layer.o, layer.gate_up, layer.down, family.head))
    hf = load(EngineConfig(model=str(tiny_dirs["tiny-text"]), model_impl="transformers")).family
    assert hf.head is hf.lm_head  # transformers' modules as they are


@pytest.mark.skipif(torch.bfloat16 not in DTYPES, reason="no BF16 units on this CPU")
@pytest.mark.parametrize("rows", [1, 2, 3])  # up to attention.UPCAST_ROWS multiplied in float32, then in bfloat16
def test_one_position_bfloat16_attention_equals_sdpa(rows):
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, d, t = 6, 2, 16, 11
    q = torch.randn(rows, heads, 1, d, generator=g).bfloat16()
    k, v = (torch.randn(rows, kv_heads, t, d, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(rows, 1, 1, t, dtype=torch.bool)
    mask[0, ..., 7:] = False  # a shorter row
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    got = decode_attention(q, k, v, mask, None, heads // kv_heads)  # [rows, 1, heads, d]
    torch.testing.assert_close(got.transpose(1, 2).float(), want, atol=2e-2, rtol=2e-2)


# A fresh process (the caches' capacities are read at its first primitive): SmolLM2's four text weight shapes, packed,
# multiplied at 1..ROWS rows (each row count a new primitive per shape); glibc's bytes in use printed at 50 and at ROWS.
_MANY_ROW_COUNTS = textwrap.dedent("""
    import ctypes, torch
    from engine.models.linear import Linear
    torch.set_num_threads(1)
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = Info
    layers = [Linear(torch.randn(out, inp)) for out, inp in ((960, 576), (576, 576), (3072, 576), (576, 1536))]
    for rows in range(1, 151):
        for layer in layers:
            layer(torch.randn(rows, layer.weight.shape[1]))
        if rows in (50, 150):
            print(libc.mallinfo2().uordblks)
""")


@pytest.mark.skipif(not heap.available() or not torch.backends.mkldnn.is_available(), reason="glibc and oneDNN")
def test_what_onednn_keeps_of_many_row_counts_stops_growing():
    """Each distinct row count is a new oneDNN primitive per weight shape, ~0.5 MB each kept: at oneDNN's and ideep's
    default capacities (1024 each) what they kept grew by ~210 MB from the 50th row count to the 150th; bounded, what
    100 more row counts add is what replacing entries costs (~0)."""
    env = {k: v for k, v in os.environ.items() if k not in PRIMITIVE_CACHES}
    out = subprocess.run([sys.executable, "-c", _MANY_ROW_COUNTS], capture_output=True, text=True, check=True, env=env,
                         timeout=300).stdout.split()
    at50, at150 = (int(v) for v in out)
    assert at150 - at50 < 16 << 20, f"oneDNN kept {(at150 - at50) >> 20} MB more for row counts 51..150"


def test_a_capacity_the_environment_sets_is_kept(monkeypatch):
    monkeypatch.setenv(PRIMITIVE_CACHES[0], "4096")
    monkeypatch.delenv(PRIMITIVE_CACHES[1], raising=False)
    bound_primitive_caches()
    assert os.environ[PRIMITIVE_CACHES[0]] == "4096"
    assert int(os.environ[PRIMITIVE_CACHES[1]]) < 1024
