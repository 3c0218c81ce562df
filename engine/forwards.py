"""The forwards a step is made of, each built from prompts and slots and run on the family (engine/models/): a decode
of the rows (the first ones: rows whose reader fell behind wait after them, engine/flow.py), a packed mixed step, a
left-padded group prefill, and one prompt's positions chunk by chunk. Where each row's keys and values go is planned
on the SlotKV first (engine/models/slot_cache.py); engine/model_runner.py chooses which forwards a step runs, and
records what they leave behind.

Shapes: rows = sequences in the forward, q = new positions per row, N = a packed forward's tokens, D = position_dims.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch

from engine.batch import Batch
from engine.models import ModelFamily, Prompt, StepInputs
from engine.models.attention import PACKED, decode_step
from engine.models.slot_cache import Segment, SlotKV

if TYPE_CHECKING:
    from engine.lora import LoraAdapter

PREFILL_CHUNK = 1024  # query positions per forward of a long prompt: bounds its activations and its mask to this x T
NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)  # what a packed forward hands transformers as its mask


def left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def adapters(f: ModelFamily, segments: list[tuple[LoraAdapter | None, int]]) -> AbstractContextManager:
    """The forward in the block runs each of its flattened tokens under its adapter: `segments` of (adapter or None,
    tokens), in the forward's order (engine/lora/apply.py)."""
    return f.lora.use(segments) if f.lora is not None else nullcontext()


def hidden_states(f: ModelFamily, embeds: torch.Tensor, step: StepInputs, positions: torch.Tensor,
                  cache: Any) -> torch.Tensor:
    """embeds [rows, q, hidden], positions [D, rows, q] -> the last layer's hidden states [rows, q, hidden]."""
    out = f.backbone(
        inputs_embeds=embeds,
        attention_mask=f.attention_mask(step),
        position_ids=positions[0] if f.position_dims == 1 else positions,
        cache=cache,
        use_cache=True,
        **f.forward_kwargs(step, embeds),
    )
    return out.last_hidden_state


def advance(b: Batch, rows: int) -> None:
    """The first `rows` rows are one position further (the others, paused, stay where they are)."""
    b.kv.advance(1, rows)
    b.kv.refresh()
    b.positions = b.positions + 1 if rows == len(b.positions) else torch.cat([b.positions[:rows] + 1,
                                                                              b.positions[rows:]])


def decode(f: ModelFamily, b: Batch, tokens: list[int],
           loras: list[LoraAdapter | None] | None = None) -> torch.Tensor:
    """One new position for each of the first len(tokens) rows (`tokens`: each one's last token, in slot order;
    `loras`: each one's adapter; the rows after them are paused) -> logits [len(tokens), vocab] in slot order; those
    rows are one position further."""
    rows = len(tokens)
    ids = torch.tensor(tokens, dtype=torch.long, device=f.device)[:, None]  # [rows, 1]
    mask = b.kv.key_mask(1, rows).to(f.device)  # [rows, T + 1]
    b.kv.plan_decode(rows)
    aside = f.cache.narrow(b.cache, rows)
    try:
        with adapters(f, [(a, 1) for a in loras or ()]), decode_step():
            hidden = hidden_states(f, f.lookup(ids), StepInputs(ids, mask, None, None),
                                   b.positions[None, :rows, None].expand(f.position_dims, -1, 1), b.cache)
    finally:
        f.cache.widen(b.cache, aside)
    advance(b, rows)
    return f.logits(hidden[:, -1])


def packed(f: ModelFamily, b: Batch, tokens: list[int], pieces: list[tuple[Prompt, int, int, int]],
           loras: list[LoraAdapter | None] | None = None) -> torch.Tensor:
    """A mixed step as one forward: one new position for each of the first len(tokens) rows (as `decode`; `loras`:
    each one's adapter) and the prompt positions [start, end) of each (prompt, slot, start, end) in `pieces`, packed
    into one row of tokens; attention is split per sequence (engine/models/attention.py) -> hidden states [N, hidden]:
    the rows' (slot order), then each piece's positions. Only for a family whose `packs_mixed_steps` (its cache is
    key/value layers only). Those rows are one position further once it returns; on an exception nothing is recorded
    (every write went past the rows' ends or into slots not in use)."""
    rows = len(tokens)
    ids = torch.tensor(tokens, dtype=torch.long, device=f.device)
    embeds = torch.cat([f.lookup(ids), *(p.embeds[s:e] for p, _, s, e in pieces)])[None]  # [1, N, hidden]
    at = torch.cat([b.positions[None, :rows].expand(f.position_dims, -1),
                    *(p.positions[:, s:e] for p, _, s, e in pieces)], 1)[:, None]  # [D, 1, N]
    b.kv.plan_packed([Segment(slot, s, e - s) for _, slot, s, e in pieces], f.device,
                     reserve=max(len(p.token_ids) for p, *_ in pieces) + 1, rows=rows)  # grow once: prompt + decode
    segments = [(a, 1) for a in loras or ()] + [(p.adapter, e - s) for p, _, s, e in pieces]
    try:
        with adapters(f, segments):
            hidden = f.backbone(
                inputs_embeds=embeds,
                # any 4-D mask makes transformers build none; the real ones (one per part) ride in the plan
                attention_mask=NO_MASK,
                position_ids=at[0] if f.position_dims == 1 else at,
                cache=b.cache,
                use_cache=True,
                **{PACKED: b.kv.plan.packed},
            ).last_hidden_state[0]
    finally:
        b.kv.refresh()
    advance(b, rows)
    return hidden


def padded(f: ModelFamily, prompts: list[Prompt], kv: SlotKV, cache: Any,
           slot: int) -> tuple[torch.Tensor, list[int]]:
    """Whole prompts in one forward, left-padded to the longest, into the slots from `slot` -> (hidden states
    [n, L, hidden], each prompt's padding)."""
    longest = max(len(p.token_ids) for p in prompts)
    pads = [longest - len(p.token_ids) for p in prompts]

    def stack(name: str, dim: int = 0) -> torch.Tensor:
        return torch.stack([left_pad(getattr(p, name), n, dim) for p, n in zip(prompts, pads, strict=True)], dim)

    lengths = torch.tensor([len(p.token_ids) for p in prompts], device=f.device)
    mask = (torch.arange(longest, device=f.device)[None, :] >= (longest - lengths)[:, None]).long()  # [n, L]
    step = StepInputs(token_ids=stack("token_ids"), mask=mask, image_mask=stack("image_mask"),
                      span_mask=stack("span_mask"))
    kv.plan_prefill(len(prompts), longest, first=slot)
    with adapters(f, [(p.adapter, longest) for p in prompts]):
        return hidden_states(f, stack("embeds"), step, stack("positions", 1), cache), pads


def chunked(f: ModelFamily, prompt: Prompt, kv: SlotKV, cache: Any, slot: int, start: int, end: int,
            score: Callable[[torch.Tensor, int], None]) -> torch.Tensor:
    """Prompt positions [start, end) of one prompt in `slot`, PREFILL_CHUNK per forward where the family allows it,
    each attending to the columns before it; `score(hidden [q, hidden], first position)` sees each forward's hidden
    states -> the last forward's logits [1, vocab]."""
    logits = None
    chunk = PREFILL_CHUNK if f.chunkable(prompt) else end - start  # (after a prefix-cache hit)
    for at in range(start, end, chunk):
        stop = min(at + chunk, end)
        step = StepInputs(prompt.token_ids[None, at:stop], prompt.token_ids.new_ones(1, stop),
                          prompt.image_mask[None, at:stop], prompt.span_mask[None, at:stop])
        kv.plan_prefill(1, stop - at, past=at, first=slot)
        kv.plan.reserve = len(prompt.token_ids) + 1  # the buffers grow once: the prompt and its first decode
        with adapters(f, [(prompt.adapter, stop - at)]):
            hidden = hidden_states(f, prompt.embeds[None, at:stop], step, prompt.positions[:, None, at:stop], cache)
        score(hidden[0], at)
        logits = f.logits(hidden[:, -1])
    return logits
