"""The attention function the engine's models run: transformers' SDPA, but grouped-query attention with a mask
goes to torch's SDPA with enable_gqa=True instead of copying K/V once per query group in every layer.

transformers' sdpa_attention_forward keeps K/V grouped only when there is no mask or a single query position; a
masked prefill (left-padded rows, a chunk of a long prompt, Gemma 3's image blocks) repeats K/V per group. torch
2.13's CPU SDPA takes enable_gqa with an attention mask and gives the same numbers as the repeat (checked in
tests/engine/test_attention.py). Everything else is transformers' own function unchanged, and masks for it are
built by transformers' own SDPA mask function (registered under the same name).

A decode step's attention on the CPU (one query position per row, inside `decode_step()`: engine/forwards.py's
decode and a packed forward's decode rows) in bfloat16 runs engine/kernels/decode_attention.c where it can be
built, else decode_attention below (torch's ops); float32 keeps SDPA, whose numbers the tests hold solo, batched and
cached tokens to. A prompt's chunk of one position (a long prompt's last piece, the one position after a
prefix-cache hit) keeps SDPA, as its other chunks do: the kernel sums in another order than SDPA, so a prompt's
numbers would otherwise depend on how it was cut.

A packed forward (a mixed step's decode tokens and prompt positions as one row of N tokens, engine/forwards.py
`packed`) passes its split as the keyword PACKED, which transformers hands down to every attention call: the decode
queries attend their own slots' columns (one batched call, as a decode step does), and each prompt segment attends
its slot causally (one call each, as a prefill chunk does), so every part computes what its own forward would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from engine.kernels import decode_attention as decode_kernel
from engine.models.linear import native_half
from engine.models.slot_cache import Packed

NAME = "splice_sdpa"
UPCAST_ROWS = 1  # half-precision decode at this many rows or fewer multiplies in float32 (decode_attention says why)
PACKED = "splice_packed"  # the backbone keyword carrying a packed forward's Packed
_decoding: ContextVar[bool] = ContextVar("splice_decoding", default=False)


@contextmanager
def decode_step() -> Iterator[None]:
    """The forwards run inside are decode steps: one query position per row is a row's next token (the module's
    docstring says why a prompt's one-position chunk is not)."""
    token = _decoding.set(True)
    try:
        yield
    finally:
        _decoding.reset(token)


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [rows, heads, q, d], key/value [rows, kv_heads, T, d] -> ([rows, q, heads, d], None)."""
    packed = kwargs.pop(PACKED, None)
    if packed is not None:
        return packed_sdpa(module, query, key, value, packed, scaling, **kwargs), None
    groups = getattr(module, "num_key_value_groups", 1)
    q = query.shape[2]
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None and not dropout
    if q == 1 and plain and query.device.type == "cpu" and query.dtype != torch.float32 and _decoding.get():
        out = decode_kernel.attend(query, key, value, attention_mask, scaling, groups)
        if out is None:  # a dtype, head size or mask the kernel does not serve, or no kernel on this host
            out = decode_attention(query, key, value, attention_mask, scaling, groups)
        return out, None
    if attention_mask is None or q == 1 or groups == 1 or not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     scaling: float | None, groups: int) -> torch.Tensor:
    """One query position per row in half precision on the CPU where the kernel does not serve (float16, a head
    size not a multiple of 16, no compiler on the host): query [rows, heads, 1, d], key/value [rows, kv_heads, T,
    d] -> [rows, 1, heads, d], each query group against its own key/value head as two batched matrix products and a
    float32 softmax.

    Why not torch's SDPA: its CPU kernel is a flash kernel tiled for many query positions, and in bfloat16 at one
    position it costs a 16-row decode step of SmolLM2 5 ms per layer where these three ops cost 0.4 ms. In float32
    both cost the same, and SDPA is kept. On cuda, SDPA's own kernels serve decode well, and are kept.

    The keys and values are copied into one block first: the slot buffers hold each row's columns apart (a slot is
    max_model_len columns wide), and torch's bfloat16 batched product copies batches that are apart itself, the keys
    transposed, which costs six times the plain copy and the product together.

    At UPCAST_ROWS rows or fewer (one stream decoding) torch's bfloat16 products cost more in calls than in bytes:
    the same ops run in float32 on the values taken there (exactly: a bfloat16 value is a float32 one), the
    probabilities still rounded to bfloat16 first (SmolLM2, ~300 columns: 91 instead of 117 us a layer at one row;
    at two rows both cost 140 us, and from three on the bfloat16 products win). On a CPU without BF16 units every
    row count does (torch's bfloat16 products there cost 4.5 ms a layer at 16 rows, ~10x float32's)."""
    rows, heads, _, d = query.shape
    kv_heads, t = key.shape[1], key.shape[2]
    if mask is not None:  # [rows, 1, 1, >= T]: boolean (True = attend) or additive
        mask = mask[..., :t]
    # the products' dtype
    work = torch.float32 if rows <= UPCAST_ROWS or not native_half(query.dtype) else query.dtype
    q = query.to(work).reshape(rows * kv_heads, groups, d)  # head h reads key/value head h // groups, as repeat_kv
    keys = key.to(work).reshape(rows * kv_heads, t, d).contiguous()
    scores = torch.bmm(q, keys.transpose(1, 2)).float().view(rows, kv_heads, groups, t)
    scores.mul_(d ** -0.5 if scaling is None else scaling)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    # the probabilities rounded to the values' dtype whatever the products' (as torch's CPU flash kernel does)
    probs = torch.softmax(scores, dim=-1).to(value.dtype).to(work).view(rows * kv_heads, groups, t)
    out = torch.bmm(probs, value.to(work).reshape(rows * kv_heads, t, d).contiguous())  # [rows * kv_heads, groups, d]
    return out.to(query.dtype).reshape(rows, 1, heads, d)


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: Packed,
                scaling: float | None, **kwargs: Any) -> torch.Tensor:
    """query [1, heads, N, d] of a packed forward, key/value [slots, kv_heads, T, d] (the slot buffers) ->
    [1, N, heads, d]: the decode rows and every segment, each attending only its own slot."""
    q = query[0]  # [heads, N, d]
    outs = []
    n, width = packed.rows, packed.decode_width
    if n:
        rows = q[:, :n].transpose(0, 1)[:, :, None]  # [rows, heads, 1, d]
        with decode_step():
            out, _ = grouped_sdpa(module, rows, key[:n, :, :width], value[:n, :, :width], packed.decode_mask,
                                  scaling=scaling, **kwargs)
        outs.append(out[:, 0])  # [rows, heads, d]
    at = n
    for s, mask in zip(packed.segments, packed.segment_masks, strict=True):
        cols = s.past + s.length
        part = q[None, :, at:at + s.length]  # [1, heads, length, d]
        out, _ = grouped_sdpa(module, part, key[s.slot:s.slot + 1, :, :cols], value[s.slot:s.slot + 1, :, :cols],
                              mask, scaling=scaling, **kwargs)
        outs.append(out[0])  # [length, heads, d]
        at += s.length
    return torch.cat(outs)[None]


def use_grouped_sdpa(model: torch.nn.Module) -> None:
    """Switches `model` (loaded with attn_implementation="sdpa") to grouped_sdpa, registering it once."""
    AttentionInterface.register(NAME, grouped_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
