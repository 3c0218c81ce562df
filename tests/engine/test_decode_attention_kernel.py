"""engine/kernels/decode_attention.c: a bfloat16 decode step's attention read from slot-buffer views equals float32
attention on the same values (to bfloat16's rounding), whatever the head size, group count, column count or mask;
a prompt's one-position chunk keeps SDPA;
what it does not serve goes back to torch's ops; the build is cached per host and a failed one leaves nothing."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.kernels import build
from engine.kernels import decode_attention as kernel
from engine.models.attention import decode_step, grouped_sdpa

needs_kernel = pytest.mark.skipif(not kernel.prepare(), reason="the kernel cannot be built here (gcc, AVX2 or AVX-512)")
# within bfloat16's rounding of the output (and of the probabilities, as torch's flash kernel rounds them)
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}


def _case(rows: int, kv_heads: int, groups: int, d: int, t: int, seed: int = 0):
    """A query as transformers lays it out ([rows, 1, heads, d] transposed) and key/value views of wider slot buffers
    holding more rows than the step uses, plus a mask: row 0 left-padded, the last row two columns short."""
    g = torch.Generator().manual_seed(seed)
    heads = kv_heads * groups
    query = torch.randn(rows, 1, heads, d, generator=g).bfloat16().transpose(1, 2)
    key, value = (torch.randn(rows + 2, kv_heads, t + 19, d, generator=g).bfloat16()[:rows, :, :t] for _ in range(2))
    mask = torch.ones(rows, 1, 1, t + 5, dtype=torch.bool)
    if t > 4:
        mask[0, ..., :3] = False
        mask[-1, ..., t - 2:] = False
    return query, key, value, mask


def _float32_attention(query, key, value, mask, scaling=None):
    out = F.scaled_dot_product_attention(query.float(), key.float(), value.float(), attn_mask=mask[..., :key.shape[2]],
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)  # [rows, 1, heads, d]


@needs_kernel
@pytest.mark.parametrize("d", [16, 48, 64, 128])  # 48: an odd count of 16-wide pieces takes the float32 products
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("t", [1, 7, 16, 33, 300])  # below, at and past the 8- and 16-column blocks, odd and even
def test_the_kernel_equals_float32_attention_on_slot_buffer_views(d, groups, t):
    for rows in (1, 5):
        query, key, value, mask = _case(rows, 2, groups, d, t)
        got = kernel.attend(query, key, value, mask, None, groups)
        assert got is not None and got.dtype == torch.bfloat16 and got.shape == (rows, 1, 2 * groups, d)
        torch.testing.assert_close(got.float(), _float32_attention(query, key, value, mask), **TOLERANCE)


@needs_kernel
def test_the_kernel_takes_the_scaling_and_no_mask():
    query, key, value, _ = _case(3, 3, 3, 64, 40)
    got = kernel.attend(query, key, value, None, 0.3, 3)
    full = torch.ones(3, 1, 1, 40, dtype=torch.bool)
    torch.testing.assert_close(got.float(), _float32_attention(query, key, value, full, 0.3), atol=1e-2, rtol=1e-2)


@needs_kernel
def test_a_row_with_no_column_to_attend_gives_zeros_and_the_others_are_unaffected():
    query, key, value, mask = _case(3, 1, 2, 64, 20)
    mask[1] = False
    got = kernel.attend(query, key, value, mask, None, 2)
    assert torch.equal(got[1].float(), torch.zeros(1, 2, 64))
    keep = [0, 2]
    torch.testing.assert_close(got[keep].float(), _float32_attention(query[keep], key[keep], value[keep], mask[keep]),
                               **TOLERANCE)


@needs_kernel
def test_a_masked_column_weighs_nothing():
    query, key, value, mask = _case(2, 1, 3, 64, 40)
    mask[:, ..., 30:] = False
    loud = value.clone()
    loud[:, :, 30:] = 1e30  # behind the mask
    assert torch.equal(kernel.attend(query, key, loud, mask, None, 3), kernel.attend(query, key, value, mask, None, 3))


@needs_kernel
def test_what_the_kernel_does_not_serve_goes_to_torchs_ops():
    query, key, value, mask = _case(2, 2, 3, 64, 10)
    additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
    assert kernel.attend(query.half(), key.half(), value.half(), mask, None, 3) is None  # float16
    assert kernel.attend(query, key, value, additive, None, 3) is None  # an additive mask
    assert kernel.attend(query, key, value, mask.expand(2, 6, 1, 15), None, 3) is None  # a mask per head
    q20, k20, v20, m20 = _case(2, 2, 3, 20, 10)
    assert kernel.attend(q20, k20, v20, m20, None, 3) is None  # head size not a multiple of 16
    # and the attention function the models run gives the same as torch's ops there
    module = type("M", (), {"num_key_value_groups": 3})()
    with decode_step():
        got, _ = grouped_sdpa(module, q20, k20, v20, m20)
    torch.testing.assert_close(got.float(), _float32_attention(q20, k20, v20, m20), atol=2e-2, rtol=2e-2)


@needs_kernel
def test_the_models_attention_function_runs_the_kernel_for_bfloat16_decode():
    query, key, value, mask = _case(4, 3, 3, 64, 50)
    module = type("M", (), {"num_key_value_groups": 3})()
    with decode_step():
        got, _ = grouped_sdpa(module, query, key, value, mask)
    assert torch.equal(got, kernel.attend(query, key, value, mask, None, 3))


def test_a_prompts_one_position_chunk_takes_sdpa_as_its_other_chunks():
    """Outside a decode step one query position is a prompt's chunk (its last piece, or what follows a prefix-cache
    hit) and takes SDPA, as the prompt's longer chunks do; inside one, the kernel."""
    g = torch.Generator().manual_seed(3)
    query = torch.randn(2, 6, 1, 64, generator=g).bfloat16()
    key, value = (torch.randn(2, 2, 9, 64, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    module = type("M", (), {"num_key_value_groups": 3})()
    chunk, _ = grouped_sdpa(module, query, key, value, mask)
    assert torch.equal(chunk, sdpa_attention_forward(module, query, key, value, mask)[0])
    if kernel.prepare():
        with decode_step():
            step, _ = grouped_sdpa(module, query, key, value, mask)
        assert torch.equal(step, kernel.attend(query, key, value, mask, None, 3))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty $SPLICE_CACHE, where gcc is there to build into it."""
    if build._compiler_version("gcc") is None:
        pytest.skip("no gcc here")
    monkeypatch.setenv("SPLICE_CACHE", str(tmp_path))
    return tmp_path


def test_the_build_is_made_once_per_host_and_reused(cache, caplog):
    tmp_path = cache
    source = tmp_path / "twice.c"
    source.write_text("int splice_twice(int x) { return 2 * x; }\n")
    with caplog.at_level(logging.INFO, logger=build.__name__):
        assert build.library(source).splice_twice(21) == 42
        built = list((tmp_path / "kernels").iterdir())
        assert len(built) == 1 and built[0].name.startswith("twice-") and built[0].suffix == ".so"
        stamp = built[0].stat().st_mtime_ns
        assert build.library(source).splice_twice(4) == 8
    assert list((tmp_path / "kernels").iterdir()) == built and built[0].stat().st_mtime_ns == stamp
    assert sum("compiled twice.c" in r.getMessage() for r in caplog.records) == 1
    source.write_text("int splice_twice(int x) { return 3 * x; }\n")  # another source: another build
    assert build.library(source).splice_twice(2) == 6
    assert len(list((tmp_path / "kernels").iterdir())) == 2


def test_a_failed_build_leaves_nothing_and_says_why(cache, caplog):
    source = cache / "broken.c"
    source.write_text("int splice_broken(int x) { return x +; }\n")
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        assert build.library(source) is None
    assert list((cache / "kernels").iterdir()) == []
    assert any("broken.c failed to compile" in r.getMessage() for r in caplog.records)


def test_kernels_off_by_the_environment_and_without_a_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLICE_CACHE", str(tmp_path))
    source = tmp_path / "off.c"
    source.write_text("int splice_off(void) { return 1; }\n")
    monkeypatch.setenv(build.ENV, "0")
    assert build.library(source) is None
    monkeypatch.delenv(build.ENV)
    assert build.library(source, cc=str(tmp_path / "no-such-gcc")) is None
    assert not (tmp_path / "kernels").exists()
