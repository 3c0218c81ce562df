"""Batched prefill and decode over one running batch; everything model-specific is the family's.

The running batch keeps each sequence's keys and values in a slot of preallocated per-layer buffers
(engine/models/slot_cache.py): a prefill writes its new rows into free slots, a decode step writes one column per
row where that row ends, and a leaving row's slot is filled by the last row. So nothing moves when rows join or
leave, except that one row. Slot order is an internal matter: `seq_ids`, `decode`'s tokens and the logits keep
the order in which sequences joined. The family (engine/models/) says what a position id is, which masks each
layer type gets, what extra inputs the forward takes, and how its non-attention states join and leave.

A mixed step (every row decodes while prompt positions of arrivals are prefilled) runs as one forward where the family
allows it (`mixed`): the rows' tokens and the prompt positions packed into one row of tokens, so the linears, norms
and MLPs run once per step instead of once for the decode and once for the prefill; attention is split per sequence
(engine/models/attention.py), so each row and each prompt gets what its own forward would give.

A prompt that asks for prompt logprobs hands the hidden states of its positions to engine/prompt_logprobs.py in each
forward that prefills it (whichever of the paths above); every other prompt's logits are its last position's only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from engine import prompt_logprobs as plp
from engine.models import ModelFamily, Prompt, StepInputs
from engine.models.attention import PACKED
from engine.models.slot_cache import Segment, SlotKV
from splice.prompt_logprobs import PromptLogprobs

PREFILL_CHUNK = 1024  # query positions per forward of a long prompt: bounds its activations and its mask to this x T
NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)  # what a packed forward hands transformers as its mask


def left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


@dataclass
class Batch:
    seq_ids: list[int]  # the order sequences joined in (what callers see)
    slot_seqs: list[int]  # the sequence in each slot
    cache: Any  # the family's cache over the slots in use
    kv: SlotKV  # the slot table and key/value buffers
    positions: torch.Tensor  # [slots] long; position id of each slot's next token
    order: torch.Tensor | None = field(default=None)  # [rows] slot of each seq_ids entry; None = same order

    @property
    def width(self) -> int:
        """Key/value columns the rows span."""
        return self.kv.width

    def reorder(self) -> None:
        slot = {s: i for i, s in enumerate(self.slot_seqs)}
        order = [slot[s] for s in self.seq_ids]
        self.order = None if order == list(range(len(order))) else torch.tensor(order)


@dataclass
class Pending:
    """A long prompt prefilled over several steps: its slot is the one after the rows in use, and it decodes
    only once its last chunk is in."""

    seq_id: int
    prompt: Prompt
    slot: int
    done: int = 0  # prompt positions cached


@dataclass
class PromptPart:
    """Prompt positions [start, end) of one sequence to prefill in a mixed step; `prompt` is given at start 0 (a long
    prompt continued over several steps is remembered by the runner)."""

    seq_id: int
    prompt: Prompt | None
    start: int
    end: int


def batch_capacity(max_running_seqs: int, max_model_len: int) -> tuple[int, int]:
    """(slots, columns) a running batch can reach: every running sequence and a long prompt being prefilled beside
    them, each up to the longest sequence and the key of its last token (a left-padded row may go further: then the
    buffers grow)."""
    return max_running_seqs + 1, max_model_len + 1


class ModelRunner:
    def __init__(self, family: ModelFamily, capacity: tuple[int, int] | None = None) -> None:
        """`capacity`: (slots, columns) the running batch can reach, which the key/value buffers are reserved at
        where that costs only what is written (engine/models/slot_cache.py); None = grown as needed."""
        self.family = family
        self.capacity = capacity
        self.batch: Batch | None = None
        self.pending: Pending | None = None
        # seq_id -> the prompt logprobs of a completed prefill, until the engine takes them (every rank makes them: the
        # logits are a model call; the other ranks' go with their rows, at remove)
        self.prompt_logprobs: dict[int, PromptLogprobs] = {}

    @property
    def seq_ids(self) -> list[int]:
        return list(self.batch.seq_ids) if self.batch else []

    def clear(self) -> None:
        """Drops every row and any prompt being prefilled over several steps (their caches freed)."""
        self.batch = None
        self.pending = None
        self.prompt_logprobs.clear()

    def _forward(self, embeds: torch.Tensor, step: StepInputs, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """embeds [rows, q, hidden], positions [D, rows, q] -> last-position logits [rows, vocab]."""
        return self.family.logits(self._hidden(embeds, step, positions, cache)[:, -1])

    def _hidden(self, embeds: torch.Tensor, step: StepInputs, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        """embeds [rows, q, hidden], positions [D, rows, q] -> the last layer's hidden states [rows, q, hidden]."""
        f = self.family
        out = f.backbone(
            inputs_embeds=embeds,
            attention_mask=f.attention_mask(step),
            position_ids=positions[0] if f.position_dims == 1 else positions,
            cache=cache,
            use_cache=True,
            **f.forward_kwargs(step, embeds),
        )
        return out.last_hidden_state

    def take_prompt_logprobs(self, seq_id: int) -> PromptLogprobs | None:
        """The prompt logprobs of a sequence whose prefill completed, once (None when it asked for none)."""
        return self.prompt_logprobs.pop(seq_id, None)

    def _prompt_done(self, seq_id: int, prompt: Prompt) -> None:
        """`prompt` is complete: its prompt logprobs, if it asked, wait for take_prompt_logprobs."""
        if plp.wants(prompt):
            self.prompt_logprobs[seq_id] = plp.finish(prompt)

    @torch.inference_mode()
    def prefill(self, seq_ids: list[int], prompts: list[Prompt]) -> torch.Tensor:
        """One merged Prompt per sequence -> logits [len(seq_ids), vocab]; the rows join the batch in new slots.

        Prompts longer than PREFILL_CHUNK go alone, chunk by chunk, where the family allows it (so no forward
        holds more than PREFILL_CHUNK queries, nor a mask of more than PREFILL_CHUNK x T); the others go together,
        left-padded. On an exception the running batch is untouched: new rows only ever write to slots past the
        ones in use, and are recorded only once every forward has succeeded.
        """
        f = self.family
        b = self.batch
        kv = b.kv if b is not None else SlotKV(self.capacity)
        cache = f.cache.for_prefill(kv, b.cache if b is not None else None)
        long = [i for i, p in enumerate(prompts) if len(p.token_ids) > PREFILL_CHUNK and f.chunkable(p)]
        group = [i for i in range(len(prompts)) if i not in long]
        slot = kv.rows
        logits, starts, ends = [], [], []
        try:
            if group:
                rows, pads = self._prefill_padded([prompts[i] for i in group], kv, cache, slot)
                logits.append(rows)
                starts += pads
                ends += [len(prompts[group[0]].token_ids) + pads[0]] * len(group)
            for k, i in enumerate(long):
                logits.append(self._prefill_span(prompts[i], kv, cache, slot + len(group) + k))
                starts.append(0)
                ends.append(len(prompts[i].token_ids))
        finally:
            kv.refresh()
        in_slots = group + long  # prompt index of each new slot
        for i in in_slots:
            self._prompt_done(seq_ids[i], prompts[i])
        kv.add_rows(starts, ends)
        nexts = torch.tensor([prompts[i].next_position for i in in_slots], device=f.device)
        new_seqs = [seq_ids[i] for i in in_slots]
        if b is None:
            self.batch = b = Batch(list(seq_ids), new_seqs, cache, kv, nexts)
        else:
            b.cache = f.cache.join(b.cache, cache)
            b.seq_ids += seq_ids
            b.slot_seqs += new_seqs
            b.positions = torch.cat([b.positions, nexts])
        b.reorder()
        kv.refresh()
        out = torch.cat(logits)  # [len(prompts), vocab] in slot order
        return out[torch.tensor(in_slots).argsort()] if long and group else out

    def _prefill_padded(self, prompts: list[Prompt], kv: SlotKV, cache: Any,
                        slot: int) -> tuple[torch.Tensor, list[int]]:
        """One forward of `prompts` left-padded to the longest, into slots from `slot` -> (logits, pads)."""
        dev = self.family.device
        longest = max(len(p.token_ids) for p in prompts)
        pads = [longest - len(p.token_ids) for p in prompts]
        embeds = torch.stack([left_pad(p.embeds, n, 0) for p, n in zip(prompts, pads, strict=True)])  # [n, L, hidden]
        lengths = torch.tensor([len(p.token_ids) for p in prompts], device=dev)
        mask = (torch.arange(longest, device=dev)[None, :] >= (longest - lengths)[:, None]).long()  # [n, L]
        step = StepInputs(
            token_ids=torch.stack([left_pad(p.token_ids, n, 0) for p, n in zip(prompts, pads, strict=True)]),
            mask=mask,
            image_mask=torch.stack([left_pad(p.image_mask, n, 0) for p, n in zip(prompts, pads, strict=True)]),
            span_mask=torch.stack([left_pad(p.span_mask, n, 0) for p, n in zip(prompts, pads, strict=True)]),
        )
        positions = torch.stack([left_pad(p.positions, n, 1) for p, n in zip(prompts, pads, strict=True)], 1)
        kv.plan_prefill(len(prompts), longest, first=slot)
        hidden = self._hidden(embeds, step, positions, cache)  # [n, L, hidden]; positions: [D, n, L]
        for i, (p, n) in enumerate(zip(prompts, pads, strict=True)):
            if plp.wants(p):
                plp.record(self.family, p, hidden[i, n:], 0)
        return self.family.logits(hidden[:, -1]), pads

    def _prefill_span(self, prompt: Prompt, kv: SlotKV, cache: Any, slot: int, start: int = 0,
                      end: int | None = None) -> torch.Tensor:
        """Prompt positions [start, end) of one prompt in `slot`, PREFILL_CHUNK per forward, each attending to the
        columns before it -> the last forward's logits [1, vocab]."""
        end = len(prompt.token_ids) if end is None else end
        logits = None
        for at in range(start, end, PREFILL_CHUNK):
            stop = min(at + PREFILL_CHUNK, end)
            step = StepInputs(prompt.token_ids[None, at:stop], prompt.token_ids.new_ones(1, stop),
                              prompt.image_mask[None, at:stop], prompt.span_mask[None, at:stop])
            kv.plan_prefill(1, stop - at, past=at, first=slot)
            kv.plan.reserve = len(prompt.token_ids) + 1  # the buffers grow once: the prompt and its first decode
            hidden = self._hidden(prompt.embeds[None, at:stop], step, prompt.positions[:, None, at:stop], cache)
            if plp.wants(prompt):
                plp.record(self.family, prompt, hidden[0], at)
            logits = self.family.logits(hidden[:, -1])
        return logits

    @torch.inference_mode()
    def prefill_part(self, seq_id: int, prompt: Prompt | None, start: int, end: int) -> torch.Tensor | None:
        """Prompt positions [start, end) of a long prompt (given at start 0, remembered after) while the batch
        decodes: logits [1, vocab] once the prompt is complete and the row has joined, else None. A prompt the
        family cannot chunk is prefilled whole at once."""
        if start == 0:
            assert prompt is not None
            if end >= len(prompt.token_ids) or not self.family.chunkable(prompt) or self.batch is None:
                return self.prefill([seq_id], [prompt])
            self.pending = Pending(seq_id, prompt, self.batch.kv.rows)
        p, b = self.pending, self.batch
        assert p is not None and b is not None and p.seq_id == seq_id and p.done == start
        try:
            logits = self._prefill_span(p.prompt, b.kv, b.cache, p.slot, start, end)
        finally:
            b.kv.refresh()
        p.done = end
        if end < len(p.prompt.token_ids):
            return None
        self.pending = None
        self._prompt_done(seq_id, p.prompt)
        b.kv.add_rows([0], [end])
        b.seq_ids.append(seq_id)
        b.slot_seqs.append(seq_id)
        b.positions = torch.cat([b.positions, b.positions.new_tensor([p.prompt.next_position])])
        b.reorder()
        b.kv.refresh()
        return logits

    @torch.inference_mode()
    def decode(self, tokens: list[int]) -> torch.Tensor:
        """tokens: the last token of every row, in `seq_ids` order -> logits [rows, vocab] in that order."""
        b = self.batch
        f = self.family
        assert b is not None and len(tokens) == len(b.seq_ids)
        ids = torch.tensor(tokens, dtype=torch.long, device=f.device)
        if b.order is not None:  # into slot order
            ids = torch.empty_like(ids).index_put_((b.order,), ids)
        ids = ids[:, None]  # [rows, 1]
        embeds = f.lookup(ids)  # [rows, 1, hidden]
        mask = b.kv.key_mask(1).to(f.device)  # [rows, T + 1]
        positions = b.positions[None, :, None].expand(f.position_dims, -1, 1)  # [D, rows, 1]
        b.kv.plan_decode()
        logits = self._forward(embeds, StepInputs(ids, mask, None, None), positions, b.cache)
        b.kv.advance()
        b.kv.refresh()
        b.positions = b.positions + 1
        return logits if b.order is None else logits[b.order]

    @torch.inference_mode()
    def mixed(self, tokens: list[int], parts: list[PromptPart]) -> tuple[torch.Tensor, torch.Tensor]:
        """One packed forward: a decode step of every row (`tokens` in `seq_ids` order, as `decode`) and the prompt
        positions of `parts` -> (logits [rows, vocab] in that order, logits [complete, vocab] of the parts whose prompt
        is now complete, in part order). Those join the batch (after the rows already in it) and decode from the next
        step. `parts` are whole prompts, or one part of a long prompt prefilled over several steps. Only for a family
        whose `packs_mixed_steps`. On an exception nothing is recorded (every write went past the rows' ends or into
        slots not in use), so the batch can still decode."""
        b, f = self.batch, self.family
        assert b is not None and len(tokens) == len(b.seq_ids) and parts
        kv = b.kv
        rows = kv.rows
        first = parts[0]
        whole = all(p.start == 0 and p.prompt is not None and p.end == len(p.prompt.token_ids) for p in parts)
        if whole:  # new rows, in the slots after the rows in use
            assert self.pending is None
            pending = None
            pieces = [(p.prompt, rows + k, 0, p.end) for k, p in enumerate(parts)]
        else:  # a part of the one long prompt: its slot is the one after the rows in use
            assert len(parts) == 1
            if first.start == 0:
                assert self.pending is None and first.prompt is not None
                pending = Pending(first.seq_id, first.prompt, rows)
            else:
                pending = self.pending
                assert pending is not None and pending.seq_id == first.seq_id and pending.done == first.start
            pieces = [(pending.prompt, pending.slot, first.start, first.end)]
        order = b.order
        ids = torch.tensor(tokens, dtype=torch.long, device=f.device)
        if order is not None:  # into slot order
            ids = torch.empty_like(ids).index_put_((order,), ids)
        embeds = torch.cat([f.lookup(ids), *(p.embeds[s:e] for p, _, s, e in pieces)])[None]  # [1, N, hidden]
        positions = torch.cat([b.positions[None].expand(f.position_dims, -1),
                               *(p.positions[:, s:e] for p, _, s, e in pieces)], 1)[:, None]  # [D, 1, N]
        kv.plan_packed([Segment(slot, s, e - s) for _, slot, s, e in pieces], f.device,
                       reserve=max(len(p.token_ids) for p, *_ in pieces) + 1)  # grow once: prompt + first decode
        try:
            out = f.backbone(
                inputs_embeds=embeds,
                # any 4-D mask makes transformers build none; the real ones (one per part) ride in the plan
                attention_mask=NO_MASK,
                position_ids=positions[0] if f.position_dims == 1 else positions,
                cache=b.cache,
                use_cache=True,
                **{PACKED: kv.plan.packed},
            )
        finally:
            kv.refresh()
        lasts = torch.tensor([e - s for _, _, s, e in pieces]).cumsum(0) + rows - 1  # each piece's last token
        complete = [k for k, (p, _, _, e) in enumerate(pieces) if e == len(p.token_ids)]
        hidden = out.last_hidden_state[0]  # [N, hidden]
        at = rows
        for p, _, s, e in pieces:  # the prompts that asked for prompt logprobs score their positions here
            if plp.wants(p):
                plp.record(f, p, hidden[at:at + e - s], s)
            at += e - s
        logits = f.logits(torch.cat([hidden[:rows], hidden[lasts[complete]]]))  # [rows + complete, vocab]
        kv.advance()
        b.positions = b.positions + 1
        if pending is not None:
            pending.done = first.end
        self.pending = pending if pending is not None and not complete else None
        if complete:
            kv.add_rows([0] * len(complete), [pieces[k][3] for k in complete])
            joined = [parts[k].seq_id for k in complete]
            for k in complete:
                self._prompt_done(parts[k].seq_id, pieces[k][0])
            b.seq_ids += joined
            b.slot_seqs += joined
            nexts = [pieces[k][0].next_position for k in complete]
            b.positions = torch.cat([b.positions, b.positions.new_tensor(nexts)])
            b.reorder()
        kv.refresh()
        decoded = logits[:rows]
        return (decoded if order is None else decoded[order]), logits[rows:]

    @torch.inference_mode()
    def fork(self, seq_id: int, new_ids: list[int]) -> None:
        """New rows `new_ids`, each a copy of `seq_id`'s row as it stands after its prompt's prefill (its key/value
        columns, its family's states, its next position): the other choices of an n > 1 request. From here on every
        row is on its own. They join after the rows in use; no long prompt is being prefilled beside them (the
        scheduler admits nothing while one is). On an exception (a buffer that cannot grow) the batch is as it was."""
        b = self.batch
        assert b is not None and seq_id in b.seq_ids and new_ids and self.pending is None
        src, rows = b.slot_seqs.index(seq_id), b.kv.rows
        try:
            for _ in new_ids:
                b.kv.fork(src)
            self.family.cache.fork(b.cache, src, len(new_ids))
        except BaseException:
            del b.kv.start[rows:], b.kv.end[rows:]
            self.family.cache.truncate(b.cache, rows)
            b.kv.refresh()
            raise
        b.seq_ids += new_ids
        b.slot_seqs += new_ids
        b.positions = torch.cat([b.positions, b.positions[src:src + 1].expand(len(new_ids))])
        b.reorder()
        b.kv.refresh()

    @torch.inference_mode()
    def remove(self, seq_ids: set[int]) -> None:
        """Drops rows now: each leaving slot takes the last slot's row, and the slot count shrinks (a long prompt
        still being prefilled keeps the slot after the rows in use)."""
        if self.pending is not None and self.pending.seq_id in seq_ids:
            self.pending = None
        for seq in seq_ids & self.prompt_logprobs.keys():
            del self.prompt_logprobs[seq]
        b = self.batch
        if b is None or not seq_ids & set(b.seq_ids):
            return
        if not set(b.seq_ids) - seq_ids and self.pending is None:
            self.batch = None  # the buffers go with the batch
            return
        for seq in seq_ids & set(b.seq_ids):
            slot, last = b.slot_seqs.index(seq), len(b.slot_seqs) - 1
            if slot != last:
                b.kv.move(last, slot)
                self.family.cache.move(b.cache, last, slot)
                b.positions[slot] = b.positions[last]
                b.slot_seqs[slot] = b.slot_seqs[last]
            b.slot_seqs.pop()
            b.kv.pop()
        p = self.pending
        if p is not None and p.slot != b.kv.rows:
            b.kv.copy_columns(p.slot, b.kv.rows, p.done)
            p.slot = b.kv.rows
        self.family.cache.truncate(b.cache, len(b.slot_seqs))
        b.positions = b.positions[:len(b.slot_seqs)]
        b.seq_ids = [s for s in b.seq_ids if s not in seq_ids]
        b.kv.refresh()
        b.reorder()
