"""engine/models/attention.py: grouped-query attention with a mask, without repeating K/V, equals transformers' SDPA
function (which repeats them), and the loaded models run it."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.config import EngineConfig
from engine.loader import load
from engine.models.attention import NAME, grouped_sdpa


def test_grouped_equals_repeated_kv_with_a_mask():
    g = torch.Generator().manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    q, k, v = (torch.randn(2, h, n, 8, generator=g) for h, n in ((6, 5), (2, 9), (2, 9)))
    mask = torch.rand(2, 1, 5, 9, generator=g) > 0.3
    mask[..., 0] = True  # every query sees something
    for m in (mask, torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)):
        got, _ = grouped_sdpa(module, q, k, v, m, scaling=0.3)
        want, _ = sdpa_attention_forward(module, q, k, v, m, scaling=0.3)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_served_models_run_the_grouped_function(tiny_dirs):
    model = load(EngineConfig(model=str(tiny_dirs["tiny-text"]))).family.model
    assert model.config._attn_implementation == NAME
