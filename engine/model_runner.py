"""Runs one step's plan: every running row decodes one position and this step's prompt parts are prefilled; returns
the logits to sample. Everything model-specific is the family's (engine/models/); the forwards are engine/forwards.py.

The running batch keeps each sequence's keys and values in a slot of preallocated per-layer buffers
(engine/models/slot_cache.py): a prefill writes its new rows into the slots after the rows in use, a decode step writes
one column per row where that row ends, and a leaving row's slot is filled by the last row, so nothing else moves. The
runner knows slots, never sequences: the engine keeps each sequence's slot on its record (engine/sequence.py) from what
`execute` and `remove` say.

`execute` is the one entry. Where the family packs a mixed step (`packs_mixed_steps`) the rows' decode tokens and the
prompt positions are one forward (`_packed`): the linears, norms and MLPs run once per step, attention is split per
sequence. Otherwise, and when a packed forward fails (so that a prompt that makes it fail fails alone), the family's
fallback runs: the decode forward, then the prompts (`_prefill`): whole prompts together left-padded (a group that
fails goes again one by one), a prompt longer than PREFILL_CHUNK chunk by chunk, and the part of a prompt prefilled
over several steps (or started from a cached prefix, `_place`) alone. Rows of completed prompts join the batch in one
place (`_join`), with the copies of an n > 1 request's row, and leave their whole blocks in the prefix cache
(engine/prefix_cache.py). A prompt that asks for prompt logprobs is scored (engine/prompt_logprobs.py) in each forward
that prefills it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine import forwards as fw
from engine import prompt_logprobs as plp
from engine.batch import Batch
from engine.models import ModelFamily, Prompt
from engine.models.slot_cache import SlotKV
from engine.prefix_cache import PrefixCache, PrefixKeys
from engine.step_threads import StepThreads

log = logging.getLogger(__name__)


@dataclass
class PromptPart:
    """Prompt positions [start, end) of one sequence to prefill in this step (plain data: tensor-parallel ranks replay
    the step, engine/tensor_parallel.py)."""

    prompt: Prompt
    start: int
    end: int
    slot: int | None = None  # where its columns are after its first part (None: this is its first part)
    copies: int = 0  # rows that start as copies of its row once it is complete: an n > 1 request's other choices
    keys: PrefixKeys | None = None  # the prefix cache's keys of its whole blocks (None: not cached)


@dataclass
class RunnerOutput:
    """What `execute` gave. Part i of the plan is named by its index."""

    # [rows + len(done), vocab]: the decoding rows' (in slot order), then each completed prompt's (in `done` order);
    # None when neither ran
    logits: torch.Tensor | None = None
    done: list[int] = field(default_factory=list)  # parts whose prompt is complete; their rows joined in this order
    slots: dict[int, int] = field(default_factory=dict)  # part -> its row's slot (done), or its columns' (not yet)
    copies: dict[int, list[int]] = field(default_factory=dict)  # done part -> the slots of its copies
    scores: list[tuple[int, plp.Piece]] = field(default_factory=list)  # (part, prompt logprobs of one forward)
    failed: dict[int, BaseException] = field(default_factory=dict)  # parts whose prefill (or copies) failed
    packed: bool = False  # the step ran as one packed forward


def batch_capacity(max_running_seqs: int, max_model_len: int) -> tuple[int, int]:
    """(slots, columns) a running batch can reach: every running sequence and a long prompt being prefilled beside
    them, each up to the longest sequence and the key of its last token (a left-padded row may go further: then the
    buffers grow)."""
    return max_running_seqs + 1, max_model_len + 1


class ModelRunner:
    def __init__(self, family: ModelFamily, capacity: tuple[int, int] | None = None,
                 prefix: PrefixCache | None = None, threads: StepThreads | None = None) -> None:
        """`capacity`: (slots, columns) the running batch can reach, which the key/value buffers are reserved at
        where that costs only what is written (engine/models/slot_cache.py); None = grown as needed. `prefix`: the
        prefix cache completed prompts leave their blocks in and cached prefixes are read from (None: none).
        `threads`: torch's threads per step by its prompt positions (engine/step_threads.py; None: left as set)."""
        self.family = family
        self.capacity = capacity
        self.prefix = prefix
        self.threads = threads
        self.batch: Batch | None = None

    @property
    def rows(self) -> int:
        """Rows in use (slots 0 .. rows - 1): the sequences that decode."""
        return self.batch.kv.rows if self.batch is not None else 0

    def clear(self) -> None:
        """Drops every row and the columns of any prompt still being prefilled (their caches freed, now)."""
        if self.batch is not None:
            self.batch.kv.free()
        self.batch = None

    @torch.inference_mode()
    def execute(self, tokens: list[int], parts: list[PromptPart], loras: list[Any] | None = None) -> RunnerOutput:
        """One step: a decode of the first len(tokens) rows (`tokens`: each one's last token, in slot order; the rows
        after them are paused and do not move, engine/flow.py; none: no row moves; `loras`: each decoded row's LoRA
        adapter, None for none) and the prompt positions of `parts`. A part whose prefill fails is in `failed` and left
        nothing behind; raises only when the decode failed (the shared cache may be half-updated: every row is lost).
        A part that does not complete its prompt is the step's last (whole prompts may come before it): its columns
        wait in the slot after the rows."""
        assert len(tokens) <= self.rows
        assert all(p.end == len(p.prompt.token_ids) for p in parts[:-1])
        if self.threads is not None:
            self.threads.set_for(sum(p.end - p.start for p in parts))
        hits = [p for p in parts if p.slot is None and p.start > 0]
        if hits:  # their cached blocks stay until they are read, whatever other prompts keep first
            size = self.prefix.block_size
            self.prefix.pinned = {k for p in hits for k in p.keys.keys[:p.start // size]}
        try:
            if tokens and parts and self.family.packs_mixed_steps:
                try:
                    return self._packed(tokens, parts, loras)
                except Exception:  # nothing was recorded
                    log.exception("packed step of %d rows and %d prompt(s) failed; running it as two", len(tokens),
                                  len(parts))
            out = RunnerOutput()
            # the rows first, the prompts after
            logits = [fw.decode(self.family, self.batch, tokens, loras)] if tokens else []
            logits += self._prefill(parts, out)
            out.logits = (logits[0] if len(logits) == 1 else torch.cat(logits)) if logits else None
            return out
        finally:
            if hits:
                self.prefix.pinned = set()

    def _score(self, out: RunnerOutput, part: int, prompt: Prompt) -> Callable[[torch.Tensor, int], None]:
        """What scores the prompt logprobs of a prompt that asks: hidden [q, hidden] of positions [start, start + q)."""
        def score(hidden: torch.Tensor, start: int) -> None:
            if prompt.prompt_logprobs is not None and (piece := plp.score(self.family, prompt, hidden, start)):
                out.scores.append((part, piece))
        return score

    def _packed(self, tokens: list[int], parts: list[PromptPart], loras: list[Any] | None) -> RunnerOutput:
        """The step as one forward (engine/forwards.py `packed`), each part in a slot after the rows in use (in part
        order) -> logits of the rows, then of the completed prompts, whose rows join the batch."""
        b, f = self.batch, self.family
        rows, decoded = b.kv.rows, len(tokens)
        last = len(parts) - 1
        ends = {last: self._place(parts[last], rows + last)}  # (first: its columns may be where the others go)
        ends |= {i: self._place(p, rows + i) for i, p in enumerate(parts[:-1])}
        pieces = [(p.prompt, rows + i, p.start, ends[i]) for i, p in enumerate(parts)]
        hidden = fw.packed(f, b, tokens, pieces, loras)  # [N, hidden]
        out = RunnerOutput(packed=True)
        complete = [k for k, (p, _, _, e) in enumerate(pieces) if e == len(p.token_ids)]
        lasts = torch.tensor([e - s for *_, s, e in pieces]).cumsum(0) + decoded - 1  # each piece's last token
        at = decoded
        for i, (p, _, s, e) in enumerate(pieces):  # the prompts that asked for prompt logprobs score their positions
            self._score(out, i, p)(hidden[at:at + e - s], s)
            at += e - s
        out.logits = f.logits(torch.cat([hidden[:decoded], hidden[lasts[complete]]]))  # [decoded + complete, vocab]
        if complete:
            self._join(b.kv, b.cache, [parts[k] for k in complete], complete, [0] * len(complete),
                       [pieces[k][3] for k in complete], out)
        if last not in complete:  # the part of a prompt prefilled over several steps: in the slot after the rows
            out.slots[last] = rows + last
        return out

    def _prefill(self, parts: list[PromptPart], out: RunnerOutput) -> list[torch.Tensor]:
        """The prompt parts of a step that is not one packed forward, after its decode: whole prompts together
        (`_prefill_group`), then each other part alone -> the completed prompts' logits."""
        whole = [i for i, p in enumerate(parts) if p.slot is None and p.start == 0 and (
            p.end >= len(p.prompt.token_ids) or not self.family.chunkable(p.prompt))]
        last, after = (parts or [None])[-1], self.rows + len(parts) - 1
        if last is not None and last.slot is not None and last.slot < after:  # a long prompt's columns, out of the
            self.batch.kv.copy_columns(last.slot, after, last.start)  # way of the rows joining before it
            last.slot = after
        logits = self._prefill_group(whole, parts, out) if whole else []
        for i in (i for i in range(len(parts)) if i not in whole):
            try:
                if (got := self._prefill_part(i, parts[i], out)) is not None:
                    logits.append(got)
            except Exception as exc:
                out.failed[i] = exc
        return logits

    def _prefill_group(self, group: list[int], parts: list[PromptPart], out: RunnerOutput) -> list[torch.Tensor]:
        """Whole prompts, prefilled together; after a failed group prefill each alone, so only the one that fails
        fails."""
        try:
            return [self._prefill_whole(group, parts, out)]
        except Exception as exc:  # the running batch is untouched by a failed prefill
            if len(group) == 1:
                out.failed[group[0]] = exc
                return []
            log.exception("prefill of %d sequences failed; each alone", len(group))
            return [t for i in group for t in self._prefill_group([i], parts, out)]

    def _prefill_whole(self, group: list[int], parts: list[PromptPart], out: RunnerOutput) -> torch.Tensor:
        """Whole prompts -> logits [len(group), vocab] in the order their rows join (new slots after the rows in use).

        Prompts longer than PREFILL_CHUNK go alone, chunk by chunk, where the family allows it (so no forward
        holds more than PREFILL_CHUNK queries, nor a mask of more than PREFILL_CHUNK x T); the others go together,
        left-padded. On an exception the running batch is untouched: new rows only ever write to slots past the
        ones in use, and are recorded only once every forward has succeeded.
        """
        f, b = self.family, self.batch
        kv = b.kv if b is not None else SlotKV(self.capacity)
        cache = f.cache.for_prefill(kv, b.cache if b is not None else None)
        long = [i for i in group if len(parts[i].prompt.token_ids) > fw.PREFILL_CHUNK and f.chunkable(parts[i].prompt)]
        padded = [i for i in group if i not in long]
        slot = kv.rows
        logits, starts, ends = [], [], []
        try:
            if padded:
                hidden, pads = fw.padded(f, [parts[i].prompt for i in padded], kv, cache, slot)  # [n, L, hidden]
                for i, h, n in zip(padded, hidden, pads, strict=True):
                    self._score(out, i, parts[i].prompt)(h[n:], 0)
                logits.append(f.logits(hidden[:, -1]))
                starts += pads
                ends += [len(parts[padded[0]].prompt.token_ids) + pads[0]] * len(padded)
            for k, i in enumerate(long):
                prompt = parts[i].prompt
                logits.append(fw.chunked(f, prompt, kv, cache, slot + len(padded) + k, 0, len(prompt.token_ids),
                                         self._score(out, i, prompt)))
                starts.append(0)
                ends.append(len(prompt.token_ids))
        finally:
            kv.refresh()
        joined = padded + long
        self._join(kv, cache, [parts[i] for i in joined], joined, starts, ends, out)
        return logits[0] if len(logits) == 1 else torch.cat(logits)

    def _prefill_part(self, i: int, part: PromptPart, out: RunnerOutput) -> torch.Tensor | None:
        """A prompt continued (or started from its cached prefix, or its first part) alone, in the slot after the
        rows in use: logits [1, vocab] once the prompt is complete and its row has joined, else None."""
        slot = self.rows
        end = self._place(part, slot)
        if self.batch is None:  # (the first part of a long prompt on an idle engine)
            self._empty_batch()
        b = self.batch
        try:
            logits = fw.chunked(self.family, part.prompt, b.kv, b.cache, slot, part.start, end,
                                self._score(out, i, part.prompt))
        finally:
            b.kv.refresh()
        if end < len(part.prompt.token_ids):
            out.slots[i] = slot
            return None
        self._join(b.kv, b.cache, [part], [i], [0], [end], out)
        return logits

    def _place(self, part: PromptPart, slot: int) -> int:
        """Puts the columns of `part`'s positions before `start` in `slot` (a slot after the rows in use): at its first
        part, its cached prefix from the prefix cache (a batch with no rows yet is made for it); later, where its last
        part left them (rows that left since moved the slot after theirs down). Returns where the part ends: the
        prompt's length for one that cannot be prefilled in parts (Gemma 3's pictures): its rest goes in this one."""
        prompt = part.prompt
        if part.slot is not None:
            if part.slot != slot:
                self.batch.kv.copy_columns(part.slot, slot, part.start)
            return part.end
        if part.start == 0:
            return part.end
        if self.batch is None:
            self._empty_batch()
        self.prefix.restore(part.keys.keys[:part.start // self.prefix.block_size], self.batch.kv, slot,
                            len(prompt.token_ids) + 1)
        return part.end if self.family.chunkable(prompt) else len(prompt.token_ids)

    def _empty_batch(self) -> None:
        """A batch with no rows yet, for a prompt's columns to wait in (a cached prefix, a long prompt's parts)."""
        kv = SlotKV(self.capacity)
        nexts = torch.empty(0, dtype=torch.long, device=self.family.device)
        self.batch = Batch(self.family.cache.new(kv), kv, nexts)

    # --- rows joining and leaving ----------------------------------------------------------------

    def _join(self, kv: SlotKV, cache: Any, parts: list[PromptPart], index: list[int], starts: list[int],
              ends: list[int], out: RunnerOutput) -> None:
        """The rows of completed prompts (`index`: their parts) join the batch in the slots after the rows in use, in
        that order: their key/value columns [start, end), their family states (`cache`: the prefill's own, or the
        running one) and next positions; their whole blocks go into the prefix cache; then each one's copies."""
        f, b = self.family, self.batch
        first = kv.rows
        for k, part in enumerate(parts):
            if self.prefix is not None and part.keys is not None:
                self.prefix.keep(part.keys.keys, kv, first + k, starts[k])
        kv.add_rows(starts, ends)
        nexts = torch.tensor([p.prompt.next_position for p in parts], device=f.device)
        if b is None:
            self.batch = b = Batch(cache, kv, nexts)
        else:
            if cache is not b.cache:
                b.cache = f.cache.join(b.cache, cache)
            b.positions = torch.cat([b.positions, nexts.to(b.positions.device)])
        for k, (i, part) in enumerate(zip(index, parts, strict=True)):
            out.done.append(i)
            out.slots[i] = first + k
            if part.copies:
                try:
                    out.copies[i] = b.fork(f.cache, first + k, part.copies)
                except Exception as exc:  # (growing the key/value buffers): its request fails, its row stays for now
                    out.failed[i] = exc
        kv.refresh()

    def keep_generated(self, slot: int, prompt: PrefixKeys, generated: list[int]) -> None:
        """The whole blocks of the tokens the row in `slot` generated into the prefix cache (engine/prefix_cache.py)."""
        if self.batch is not None and self.prefix is not None:
            self.prefix.keep_generated(self.batch.kv, slot, prompt, generated)

    @torch.inference_mode()
    def swap(self, a: int, b: int) -> None:
        """Rows `a` and `b` trade slots: the engine keeps the rows a step decodes first, and those whose reader fell
        behind after them (engine/flow.py)."""
        self.batch.swap(self.family.cache, a, b)

    @torch.inference_mode()
    def remove(self, slots: list[int]) -> dict[int, int]:
        """Drops the rows in `slots` now (engine/batch.py) -> where the rows that moved went (old slot -> new slot)."""
        return self.batch.remove(self.family.cache, slots) if self.batch is not None else {}
