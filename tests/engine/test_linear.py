"""engine/models/linear.py: a weight packed once for oneDNN multiplies as F.linear does (float32 and, where the CPU has
BF16 units, bfloat16), with and without a bias, for any leading shape; SPLICE_PACKED_LINEAR=0 keeps F.linear; and the
served text stacks and vocabulary projections run packed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.loader import load
from engine.models.attention import decode_attention
from engine.models.linear import Linear, can_pack

DTYPES = [torch.float32, *([torch.bfloat16] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else [])]


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
def test_one_position_bfloat16_attention_equals_sdpa():
    g = torch.Generator().manual_seed(1)
    rows, heads, kv_heads, d, t = 3, 6, 2, 16, 11
    q = torch.randn(rows, heads, 1, d, generator=g).bfloat16()
    k, v = (torch.randn(rows, kv_heads, t, d, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(rows, 1, 1, t, dtype=torch.bool)
    mask[0, ..., 7:] = False  # a shorter row
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    got = decode_attention(q, k, v, mask, None, heads // kv_heads)  # [rows, 1, heads, d]
    torch.testing.assert_close(got.transpose(1, 2).float(), want, atol=2e-2, rtol=2e-2)
