"""Splice's own forward of a Llama-architecture text stack (LlamaModel; Qwen2Model, whose only difference is q/k/v
biases), used by the runner instead of calling transformers' modules: `--model-impl` (EngineConfig.model_impl).

Why: at the sizes the engine batches on CPU (tiny-text: 64 decode rows, 2 layers x 64 hidden) a step's cost is not
arithmetic but per-op and per-module overhead: transformers' forward goes through decorators, a mask builder,
output capturing, a rotary module, and 9 module calls per layer with kwargs passed down at every level. This forward
runs the same ops as a straight sequence of functional calls, with q/k/v and gate/up as one matmul each and the
rotary embedding applied to queries and keys in one go (bench/lean_forward.py measures it against HF's modules).

Exactness (HF is the reference): every op is HF's own, in HF's order (RMSNorm in float32 as LlamaRMSNorm, rotary
cos/sin computed from the position ids exactly as LlamaRotaryEmbedding, rotate_half, residual adds), attention is the
engine's attention function itself (engine/models/attention.py `grouped_sdpa`, called with the HF attention module for
its head grouping, so masks, packed steps and the slot cache behave as under transformers), and the caches are the
same SlotCache. The fused matmuls compute each output column over the same inputs as the separate ones. On the CPU the
linears multiply packed weights through oneDNN (engine/models/linear.py), which sums in another order than F.linear's
MKL: logits agree with HF's modules within float rounding (tests/engine/test_lean_llama.py), and are bit-identical
with SPLICE_PACKED_LINEAR=0.

Weights are HF's: q/k/v and gate/up are concatenated once, and the HF modules' parameters are replaced by views into
the fused tensors, so HF's modules (HF generate on the same model, in tests) still compute with the same values; the
CPU's packed copies hold them once more.

Not used (the loader keeps HF's modules) under tensor parallelism (transformers shards the weights by its own plan
and all-reduces in hooks on the modules' forwards, which a functional forward would skip), for rope types whose
frequencies change with the sequence length ("dynamic", "longrope"), for sliding-window layers, and for families that
pass the backbone more than one causal mask, M-RoPE positions or extra inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.models.attention import grouped_sdpa
from engine.models.linear import Linear

IMPLS = ("auto", "splice", "transformers")  # EngineConfig.model_impl / `splice engine --model-impl`
ARCHITECTURES = ("LlamaModel", "Qwen2Model")  # text stacks with a lean forward (exact classes, not subclasses)


@dataclass
class LeanOutput:
    last_hidden_state: torch.Tensor  # [rows, q, hidden], after the final norm (what the runner reads)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: its op sequence (float32 statistics, then the input dtype, then the weight); in float32, torch's
    own rms_norm, the same sequence in one call (~40% less time at decode sizes; bit-identical for every hidden size
    checked, 64 to 4096, and the tests compare logits)."""
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb on one tensor: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def fuse(modules: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linears on the same input; their parameters become views into it."""
    weight = torch.cat([m.weight.detach() for m in modules])
    biases = [m.bias for m in modules]
    bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
    if bias is None and any(b is not None for b in biases):
        raise ValueError("fused linears must all have a bias or none")
    at = 0
    for m in modules:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(weight[at:at + n], requires_grad=False)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[at:at + n], requires_grad=False)
        at += n
    return weight, bias


class LeanLayer:
    """One decoder layer's tensors (HF's, fused where two linears read the same input)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.attn = attn  # handed to grouped_sdpa: its num_key_value_groups and is_causal, as under transformers
        self.idx = attn.layer_idx
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.q_width = attn.q_proj.weight.shape[0]
        self.k_width = attn.k_proj.weight.shape[0]
        self.qkv = Linear(*fuse([attn.q_proj, attn.k_proj, attn.v_proj]))
        self.o = Linear(attn.o_proj.weight, attn.o_proj.bias)
        self.gate_up = Linear(*fuse([mlp.gate_proj, mlp.up_proj]))
        self.down = Linear(mlp.down_proj.weight, mlp.down_proj.bias)
        act = getattr(mlp.config, "hidden_act", None)
        self.act = F.silu if act in ("silu", "swish") else mlp.act_fn  # HF's module for anything else
        self.ln1, self.eps1 = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.ln2, self.eps2 = layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: Any, cache: Any,
                 kwargs: dict[str, Any]) -> torch.Tensor:
        rows, q, _ = h.shape
        d = self.head_dim
        qkv = self.qkv(rms_norm(h, self.ln1, self.eps1))  # [rows, q, (heads + 2 kv) d]
        qk = rotate(qkv[..., :self.q_width + self.k_width].view(rows, q, -1, d).transpose(1, 2), cos, sin)
        heads = self.q_width // d
        query, key = qk[:, :heads], qk[:, heads:]  # [rows, heads | kv_heads, q, d]
        value = qkv[..., self.q_width + self.k_width:].view(rows, q, -1, d).transpose(1, 2)
        if cache is not None:
            key, value = cache.update(key, value, self.idx)
        out, _ = grouped_sdpa(self.attn, query, key, value, mask, scaling=self.scaling, **kwargs)
        h = h + self.o(out.reshape(rows, q, -1))
        gate, up = self.gate_up(rms_norm(h, self.ln2, self.eps2)).chunk(2, dim=-1)
        return h + self.down(self.act(gate) * up)


class LeanDecoder:
    """Called as the runner calls a backbone: (inputs_embeds [rows, q, hidden], attention_mask: None or one 4-D
    boolean mask, position_ids [rows, q], cache, **attention keywords such as the packed split) -> LeanOutput."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        self.hf = backbone  # kept for its rotary buffers and config
        self.config = backbone.config
        self.rotary = backbone.rotary_emb
        self.layers = [LeanLayer(layer) for layer in backbone.layers[:self.config.num_hidden_layers]]
        self.norm, self.eps = backbone.norm.weight, backbone.norm.variance_epsilon

    def __call__(self, inputs_embeds: torch.Tensor, attention_mask: Any = None,
                 position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool = True,
                 **kwargs: Any) -> LeanOutput:
        h = inputs_embeds
        if position_ids is None:  # as HF: the columns after what the cache holds
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(h.shape[1], device=h.device) + past)[None]
        # LlamaRotaryEmbedding.forward, once per forward (not a table: the same ops give the same bits)
        freqs = position_ids[..., None].float() * self.rotary.inv_freq.to(device=h.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = self.rotary.attention_scaling
        cos = (emb.cos() * scale).to(h.dtype)[:, None]  # [rows, 1, q, d]
        sin = (emb.sin() * scale).to(h.dtype)[:, None]
        for layer in self.layers:
            h = layer(h, cos, sin, attention_mask, cache, kwargs)
        return LeanOutput(rms_norm(h, self.norm, self.eps))


def unsupported(backbone: torch.nn.Module, tensor_parallel: bool = False) -> str | None:
    """Why `backbone` has no lean forward, or None when it has one."""
    if tensor_parallel:
        return "tensor parallelism shards transformers' modules by its own plan"
    arch = type(backbone).__name__
    if arch not in ARCHITECTURES:
        return f"{arch} has no lean forward (only {', '.join(ARCHITECTURES)})"
    rope = (getattr(backbone.config, "rope_parameters", None) or {}).get("rope_type", "default")
    if "dynamic" in rope or rope == "longrope":
        return f"rope type {rope!r} changes its frequencies with the sequence length"
    if any(getattr(layer.self_attn, "sliding_window", None) is not None for layer in backbone.layers):
        return "sliding-window attention layers"
    projections = [getattr(part, name, None) for layer in backbone.layers
                   for part, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                                       (layer.mlp, ("gate_proj", "up_proj", "down_proj")))
                   for name in names]
    if any(type(p) is not torch.nn.Linear for p in projections):
        return "projections that are not plain torch Linear layers (quantized or wrapped)"
    return None
