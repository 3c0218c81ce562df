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

The engine calls `step` once per iteration: the rows' decode and this step's prompt parts (whole prompts, or the next
part of a long one prefilled over several steps). One packed forward or separate ones is the runner's choice (the
family's `packs_mixed_steps` and `chunkable`), and so is the fallback that keeps a failing prompt from failing others;
rows of completed prompts join the batch in one place (`_join`).

A prompt whose first part starts past 0 begins with a prefix found in the prefix cache (engine/prefix_cache.py): its
blocks are copied into the slot after the rows in use and it continues like a long prompt. Every prompt completed
leaves its whole blocks in the prefix cache (`_join`).

A prompt that asks for prompt logprobs hands the hidden states of its positions to engine/prompt_logprobs.py in each
forward that prefills it (whichever of the paths above); every other prompt's logits are its last position's only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from engine import prompt_logprobs as plp
from engine.models import ModelFamily, Prompt, StepInputs
from engine.models.attention import PACKED
from engine.models.slot_cache import Segment, SlotKV
from engine.prefix_cache import PrefixCache
from splice.prompt_logprobs import PromptLogprobs

log = logging.getLogger(__name__)

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
class Partial:
    """A long prompt prefilled over several steps: where its columns are (its slot: the one after the rows in use, once
    its next part runs) and it decodes only once its last part is in. How far it is, is its next part's `start`."""

    seq_id: int
    prompt: Prompt
    slot: int


@dataclass
class PromptPart:
    """Prompt positions [start, end) of one sequence to prefill in this step; `prompt` is given at start 0 (a long
    prompt continued over several steps is remembered by the runner)."""

    seq_id: int
    prompt: Prompt | None
    start: int
    end: int


@dataclass
class Stepped:
    """What one `step` gave: logits [rows + len(joined), vocab], the decoding rows' (in `seq_ids` order as the step
    began) then those of the prompts completed in it (in `joined` order); None when neither ran."""

    logits: torch.Tensor | None
    joined: list[int]  # the parts' sequences whose prompt is complete: their rows joined the batch, after the others
    packed: bool = False  # the step ran as one packed forward
    failed: dict[int, BaseException] = field(default_factory=dict)  # parts whose prefill failed (the others went on)


def batch_capacity(max_running_seqs: int, max_model_len: int) -> tuple[int, int]:
    """(slots, columns) a running batch can reach: every running sequence and a long prompt being prefilled beside
    them, each up to the longest sequence and the key of its last token (a left-padded row may go further: then the
    buffers grow)."""
    return max_running_seqs + 1, max_model_len + 1


class ModelRunner:
    def __init__(self, family: ModelFamily, capacity: tuple[int, int] | None = None,
                 prefix: PrefixCache | None = None) -> None:
        """`capacity`: (slots, columns) the running batch can reach, which the key/value buffers are reserved at
        where that costs only what is written (engine/models/slot_cache.py); None = grown as needed. `prefix`: the
        prefix cache completed prompts leave their blocks in and cached prefixes are read from (None: none)."""
        self.family = family
        self.capacity = capacity
        self.prefix = prefix
        self.batch: Batch | None = None
        self.partial: Partial | None = None  # a long prompt being prefilled over several steps
        # seq_id -> the prompt logprobs of a completed prefill, until the engine takes them (every rank makes them: the
        # logits are a model call; the other ranks' go with their rows, at remove)
        self.prompt_logprobs: dict[int, PromptLogprobs] = {}

    @property
    def seq_ids(self) -> list[int]:
        return list(self.batch.seq_ids) if self.batch else []

    def clear(self) -> None:
        """Drops every row and any prompt being prefilled over several steps (their caches freed)."""
        self.batch = None
        self.partial = None
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
    def step(self, tokens: list[int], parts: list[PromptPart]) -> Stepped:
        """One engine step: a decode of every row (`tokens`: each row's last token, in `seq_ids` order) and the prompt
        positions of `parts`. One packed forward where the family packs it (a packed forward that fails runs again as
        two, so that a prompt that makes it fail fails alone); else the decode, then the prompts. A part whose prefill
        fails is in `failed` and recorded nothing; raises only when the decode failed (the shared cache may be
        half-updated: every row is lost)."""
        hits = [p for p in parts if p.prompt is not None and p.start > 0]
        if hits:  # their cached blocks stay until they are read, whatever other prompts keep first
            size = self.prefix.block_size
            self.prefix.pinned = {k for p in hits for k in p.prompt.prefix_keys.keys[:p.start // size]}
        try:
            return self._step(tokens, parts)
        finally:
            if hits:
                self.prefix.pinned = set()

    def _step(self, tokens: list[int], parts: list[PromptPart]) -> Stepped:
        if tokens and parts and self.family.packs_mixed_steps:
            try:
                decoded, prefilled = self.mixed(tokens, parts)
                rows = set(self.seq_ids)  # the prompts completed in it joined them
                return Stepped(torch.cat([decoded, prefilled]), [p.seq_id for p in parts if p.seq_id in rows], True)
            except Exception:  # nothing was recorded
                log.exception("packed step of %d rows and %d prompt(s) failed; running it as two", len(tokens),
                              len(parts))
        logits = [self.decode(tokens)] if tokens else []  # the rows first: the prompts join after them
        ran = Stepped(None, [])
        # a prompt that fits in this step, or one the family cannot prefill in parts, goes whole
        whole = [p for p in parts if p.start == 0 and (p.end >= len(p.prompt.token_ids) or self.batch is None
                                                         or not self.family.chunkable(p.prompt))]
        if whole:
            logits += self._prefill_whole(whole, ran)
        for part in (p for p in parts if not any(p is w for w in whole)):
            try:
                if part.prompt is not None and part.start > 0:  # its cached prefix first, in the slot after the rows
                    self._restore(part, self.batch.kv.rows if self.batch is not None else 0)
                if (out := self._prefill_part(part)) is not None:
                    logits.append(out)
                    ran.joined.append(part.seq_id)
            except Exception as exc:
                ran.failed[part.seq_id] = exc
        ran.logits = torch.cat(logits) if logits else None
        return ran

    def _prefill_whole(self, parts: list[PromptPart], ran: Stepped) -> list[torch.Tensor]:
        """Whole prompts, prefilled together; after a failed group prefill each alone, so only the one that fails
        fails."""
        ids = [p.seq_id for p in parts]
        try:
            logits = self.prefill(ids, [p.prompt for p in parts])
        except Exception as exc:  # the running batch is untouched by a failed prefill
            if len(parts) == 1:
                ran.failed[ids[0]] = exc
                return []
            log.exception("prefill of %d sequences failed; each alone", len(parts))
            return [t for p in parts for t in self._prefill_whole([p], ran)]
        ran.joined += ids
        return [logits]

    def _restore(self, part: PromptPart, slot: int) -> None:
        """A prompt whose positions [0, part.start) are in the prefix cache: their blocks go into `slot` (a slot after
        the rows in use; a batch with no rows yet is made for it). One whose rest goes beyond this part continues
        from there like a long prompt; one that cannot be prefilled in parts (Gemma 3's pictures) has the rest in
        this one part."""
        assert self.prefix is not None and part.prompt is not None
        prompt = part.prompt
        if not self.family.chunkable(prompt):
            part.end = len(prompt.token_ids)
        b = self.batch
        if b is None:
            kv = SlotKV(self.capacity)
            nexts = torch.empty(0, dtype=torch.long, device=self.family.device)
            b = Batch([], [], self.family.cache.new(kv), kv, nexts)
        keys = prompt.prefix_keys.keys[:part.start // self.prefix.block_size]
        self.prefix.restore(keys, b.kv, slot, len(prompt.token_ids) + 1)
        self.batch = b
        if slot == b.kv.rows:  # (a prompt restored among others completes in this step: no partial)
            self.partial = Partial(part.seq_id, prompt, slot)

    def _continue(self, part: PromptPart) -> Partial:
        """The long prompt this part continues (or starts), its columns in the slot after the rows in use: rows that
        left since its last part moved it down by one slot each (its `start` columns are cached)."""
        kv = self.batch.kv
        if part.start == 0:
            assert part.prompt is not None
            return Partial(part.seq_id, part.prompt, kv.rows)
        p = self.partial
        assert p is not None and p.seq_id == part.seq_id
        if p.slot != kv.rows:
            kv.copy_columns(p.slot, kv.rows, part.start)
            p.slot = kv.rows
        return p

    def _join(self, kv: SlotKV, cache: Any, seq_ids: list[int], prompts: list[Prompt], starts: list[int],
              ends: list[int], order: list[int] | None = None) -> None:
        """The rows of completed prompts join the batch, in the slots after the rows in use (in `seq_ids` order; callers
        see them in `order`, by default the same): their key/value columns [start, end), their family states (`cache`:
        the prefill's own, or the running one) and next positions; their prompt logprobs, if asked, are made."""
        f, b = self.family, self.batch
        for k, (seq_id, prompt) in enumerate(zip(seq_ids, prompts, strict=True)):
            self._prompt_done(seq_id, prompt)
            if self.prefix is not None and prompt.prefix_keys is not None:
                self._keep(prompt, kv, kv.rows + k, starts[k])
        kv.add_rows(starts, ends)
        nexts = torch.tensor([p.next_position for p in prompts], device=f.device)
        order = list(seq_ids if order is None else order)
        if b is None:
            self.batch = b = Batch(order, list(seq_ids), cache, kv, nexts)
        else:
            if cache is not b.cache:
                b.cache = f.cache.join(b.cache, cache)
            b.seq_ids += order
            b.slot_seqs += seq_ids
            b.positions = torch.cat([b.positions, nexts.to(b.positions.device)])
        b.reorder()
        kv.refresh()

    def _keep(self, prompt: Prompt, kv: SlotKV, slot: int, start: int) -> None:
        """`prompt`'s whole blocks into the prefix cache, from its columns in `slot` (from column `start`); a failure
        to keep them costs later hits only."""
        try:
            self.prefix.store(prompt.prefix_keys.keys, kv, slot, start)
        except Exception:
            log.exception("keeping a prompt's blocks in the prefix cache failed")

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
        self._join(kv, cache, [seq_ids[i] for i in in_slots], [prompts[i] for i in in_slots], starts, ends, seq_ids)
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
        chunk = PREFILL_CHUNK if self.family.chunkable(prompt) else end - start  # (after a prefix-cache hit)
        for at in range(start, end, chunk):
            stop = min(at + chunk, end)
            step = StepInputs(prompt.token_ids[None, at:stop], prompt.token_ids.new_ones(1, stop),
                              prompt.image_mask[None, at:stop], prompt.span_mask[None, at:stop])
            kv.plan_prefill(1, stop - at, past=at, first=slot)
            kv.plan.reserve = len(prompt.token_ids) + 1  # the buffers grow once: the prompt and its first decode
            hidden = self._hidden(prompt.embeds[None, at:stop], step, prompt.positions[:, None, at:stop], cache)
            if plp.wants(prompt):
                plp.record(self.family, prompt, hidden[0], at)
            logits = self.family.logits(hidden[:, -1])
        return logits

    def _prefill_part(self, part: PromptPart) -> torch.Tensor | None:
        """Prompt positions [start, end) of a long prompt in the slot after the rows in use: logits [1, vocab] once the
        prompt is complete and its row has joined, else None."""
        b = self.batch
        p = self._continue(part)
        try:
            logits = self._prefill_span(p.prompt, b.kv, b.cache, p.slot, part.start, part.end)
        finally:
            b.kv.refresh()
        if part.end < len(p.prompt.token_ids):
            self.partial = p
            return None
        self.partial = None
        self._join(b.kv, b.cache, [part.seq_id], [p.prompt], [0], [part.end])
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
        whole = all(p.prompt is not None and p.end == len(p.prompt.token_ids) for p in parts)
        if whole:  # new rows, in the slots after the rows in use (from their cached prefix, where they have one)
            partial = None
            for k, p in enumerate(parts):
                if p.start > 0:
                    self._restore(p, rows + k)
            self.partial = None
            pieces = [(p.prompt, rows + k, p.start, p.end) for k, p in enumerate(parts)]
        else:  # a part of the one long prompt: its slot is the one after the rows in use
            assert len(parts) == 1
            if first.prompt is not None and first.start > 0:
                self._restore(first, rows)
            partial = self._continue(first)
            pieces = [(partial.prompt, partial.slot, first.start, first.end)]
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
        self.partial = partial if partial is not None and not complete else None
        if complete:
            self._join(kv, b.cache, [parts[k].seq_id for k in complete], [pieces[k][0] for k in complete],
                       [0] * len(complete), [pieces[k][3] for k in complete])
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
        assert b is not None and seq_id in b.seq_ids and new_ids and self.partial is None
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

    def keep_generated(self, seq_id: int, keys: list[bytes], first: int) -> None:
        """Blocks `first`, first + 1, ... of a running row (`keys`: theirs, from engine/prefix_cache.py
        PrefixKeys.extend) into the prefix cache, as far as its columns are written: its generated tokens, which a
        multi-turn chat's next prompt re-sends."""
        b = self.batch
        if self.prefix is None or b is None or seq_id not in b.slot_seqs or not keys:
            return
        slot, size = b.slot_seqs.index(seq_id), self.prefix.block_size
        start = b.kv.start[slot]
        whole = (b.kv.end[slot] - start) // size - first  # blocks of it whose every column is written
        if whole > 0:
            try:
                self.prefix.store(keys[:whole], b.kv, slot, start + first * size)
            except Exception:
                log.exception("keeping a sequence's generated blocks in the prefix cache failed")

    @torch.inference_mode()
    def remove(self, seq_ids: set[int]) -> None:
        """Drops rows now: each leaving slot takes the last slot's row, and the slot count shrinks (a long prompt
        still being prefilled moves into the slot after the rows in use when its next part runs)."""
        if self.partial is not None and self.partial.seq_id in seq_ids:
            self.partial = None
        for seq in seq_ids & self.prompt_logprobs.keys():
            del self.prompt_logprobs[seq]
        b = self.batch
        if b is not None and not b.seq_ids and self.partial is None:
            self.batch = None  # made for a prompt restored from the prefix cache, which left before it joined
            return
        if b is None or not seq_ids & set(b.seq_ids):
            return
        if not set(b.seq_ids) - seq_ids and self.partial is None:
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
        self.family.cache.truncate(b.cache, len(b.slot_seqs))
        b.positions = b.positions[:len(b.slot_seqs)]
        b.seq_ids = [s for s in b.seq_ids if s not in seq_ids]
        b.kv.refresh()
        b.reorder()
