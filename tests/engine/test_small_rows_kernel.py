"""engine/kernels/small_rows_bf16.c: one or two float32 rows times a bfloat16 weight give the sums of the widened
path's float32 product (oneDNN's, on the weight's float32 copy) bit for bit on AVX2, and the exact sums to float32's
rounding anywhere, with or without a bias, for any shape (blocks of four and of one, inputs past one chunk of
K_CHUNK) and strided input rows; a widened Linear's one or two rows go through it; what it does not serve goes back
to the caller."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import small_rows
from engine.models import linear
from engine.models.linear import Linear

needs_kernel = pytest.mark.skipif(not small_rows.prepare(), reason="the kernel cannot be built here (gcc, AVX2)")
# the kernel's order of sums is oneDNN's AVX2 one; on another ISA oneDNN may block its sums otherwise
ONEDNN_AVX2 = torch.backends.cpu.get_cpu_capability() == "AVX2"


@pytest.fixture
def widened(monkeypatch):
    monkeypatch.setattr(linear, "native_bf16", lambda: False)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("inputs,outputs", [(1, 8), (576, 576), (576, 1544), (1536, 192), (2500, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_small_rows_are_the_widened_products_sums(widened, rows, inputs, outputs, bias):
    g = torch.Generator().manual_seed(rows * 1000 + inputs + outputs)
    w = torch.randn(outputs, inputs, generator=g).bfloat16()
    b = torch.randn(outputs, generator=g).bfloat16() if bias else None
    lin = Linear(w, b)
    x = torch.randn(rows, inputs + 24, generator=g)[:, 5:5 + inputs].bfloat16().float()  # strided rows, as views
    got = small_rows.product(x, lin.blocked, lin.packed_bias)
    assert got is not None and got.shape == (rows, outputs) and got.dtype == torch.float32
    if ONEDNN_AVX2:
        assert torch.equal(got, lin._product(x))
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    bound = (x.double().abs() @ w.double().abs().T) * inputs * 2 ** -24 + 1e-6  # float32 sums, in any order
    assert ((got.double() - exact).abs() <= bound).all()


@needs_kernel
@pytest.mark.parametrize("rows", [(1,), (1, 1), (2, 1), (1, 2)])
def test_a_widened_linears_one_or_two_rows_take_the_kernel(widened, rows):
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(48, 64, generator=g).bfloat16(), torch.randn(48, generator=g).bfloat16()
    lin = Linear(w, b)
    assert lin.blocked is not None
    x = torch.randn(*rows, 64, generator=g).bfloat16()
    kernel = small_rows.product(x.float().reshape(-1, 64), lin.blocked, b.float())
    assert torch.equal(lin(x), kernel.reshape(*rows, 48).bfloat16())


@needs_kernel
def test_what_it_does_not_serve_is_left_to_the_caller(widened):
    assert small_rows.blocked(torch.randn(12, 64).bfloat16()) is None  # outputs not a multiple of 8
    assert small_rows.blocked(torch.randn(16, 64)) is None  # a float32 weight
    assert Linear(torch.randn(16, 64)).blocked is None  # float32: oneDNN's product as it is
    w = small_rows.blocked(torch.randn(16, 64).bfloat16())
    assert small_rows.product(torch.randn(3, 64), w, None) is None  # three rows: oneDNN's product
    assert small_rows.product(torch.randn(1, 128)[:, ::2], w, None) is None  # a row's inputs not adjacent
    with pytest.raises(ValueError, match="blocked weight"):
        small_rows.product(torch.randn(1, 60), w, None)  # not this weight's inputs
