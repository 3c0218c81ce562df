"""Penalties and masks over a whole batch's logits, in vLLM's order (vllm/v1/sample/sampler.py): allowed_token_ids,
bad words, min_tokens, logit_bias, then the repetition, frequency and presence penalties.

State lives in tables of one row per sequence that asked for it ([slots, vocab], grown as needed): the output
token counts and prompt presence of penalized sequences (counted on the engine, one scatter per step), and one
additive row per masked sequence (logit_bias values, -inf outside allowed_token_ids and on one-token bad words).
A step gathers the rows of the batch's sequences and applies each control to all of them in a few tensor ops; the
Python work per step is a pass over the rows (and over each row's multi-token bad words and min_tokens stop IDs).
Controls act on each row alone, so a row's result never depends on its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from engine.sequence import Sequence
from splice.sampling import SamplingParams

NEG_INF = float("-inf")


class RowTable:
    """A [slots, vocab] tensor whose rows belong to sequences; grows by doubling, a freed row is reused."""

    def __init__(self, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        self.data = torch.zeros(0, vocab, dtype=dtype, device=device)  # [slots, vocab]
        self._slot: dict[int, int] = {}  # seq_id -> its row
        self._free: list[int] = []

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._slot

    def add(self, seq_id: int) -> int:
        """A zeroed row for `seq_id`."""
        if not self._free:
            old = self.data.shape[0]
            grown = self.data.new_zeros(max(4, 2 * old), self.data.shape[1])
            grown[:old] = self.data
            self.data = grown
            self._free = list(range(grown.shape[0] - 1, old - 1, -1))
        slot = self._slot[seq_id] = self._free.pop()
        self.data[slot].zero_()
        return slot

    def free(self, seq_id: int) -> None:
        slot = self._slot.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)

    def slots(self, seq_ids: Seq[int]) -> torch.Tensor:
        """[len(seq_ids)] long: the row of each sequence."""
        return torch.tensor([self._slot[s] for s in seq_ids], dtype=torch.long, device=self.data.device)


@dataclass
class _Dynamic:
    """What a sequence bans by looking at its own output, step by step."""

    prefixed: list[tuple[tuple[int, ...], int]]  # multi-token bad words: (the tokens before, the banned last token)
    stops: tuple[int, ...]  # banned while fewer than min_tokens are out: EOS and stop_token_ids
    min_tokens: int


class LogitsControls:
    """Per-sequence state of the penalties and masks; `apply` before sampling, `record` the tokens after."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._tables: tuple[RowTable, RowTable, RowTable] | None = None  # made at the first logits (their width)
        self._pending: dict[int, tuple[SamplingParams, list[int], tuple[int, ...]]] = {}
        self._dynamic: dict[int, _Dynamic] = {}

    def start(self, seq: Sequence, prompt_ids: Seq[int]) -> None:
        """`seq` decodes from now; `prompt_ids` are its prompt's token IDs (not the positions of supplied
        embeddings: those are no tokens). Its rows are made at its first `apply`, when the vocabulary is known."""
        p = seq.sampling
        prefixed = [(tuple(s[:-1]), s[-1]) for s in p.bad_words_token_ids if len(s) > 1]
        stops = tuple(dict.fromkeys((*seq.eos_token_ids, *p.stop_token_ids))) if p.min_tokens else ()
        if prefixed or stops:
            self._dynamic[seq.seq_id] = _Dynamic(prefixed, stops, p.min_tokens)
        if p.penalized or p.masked:
            self._pending[seq.seq_id] = (p, list(prompt_ids) if p.repetition_penalty != 1.0 else [],
                                         tuple(s[0] for s in p.bad_words_token_ids if len(s) == 1))

    def release(self, seq_id: int) -> None:
        self._pending.pop(seq_id, None)
        self._dynamic.pop(seq_id, None)
        if self._tables is not None:
            for table in self._tables:
                table.free(seq_id)

    def _rows(self, vocab: int) -> tuple[RowTable, RowTable, RowTable]:
        """(output counts, prompt presence, additive bias) with every started sequence's rows filled."""
        if self._tables is None:
            self._tables = (RowTable(vocab, torch.int32, self.device), RowTable(vocab, torch.bool, self.device),
                            RowTable(vocab, torch.float32, self.device))
        counts, prompt, bias = self._tables
        for seq_id, (p, prompt_ids, banned) in self._pending.items():
            if p.penalized:
                counts.add(seq_id)
                slot = prompt.add(seq_id)  # (add may grow the table: index after it)
                row = prompt.data[slot]
                ids = [t for t in prompt_ids if t < vocab]
                if ids:
                    row[torch.tensor(ids, device=self.device)] = True
            if p.masked:
                slot = bias.add(seq_id)
                row = bias.data[slot]
                if p.allowed_token_ids:
                    row.fill_(NEG_INF)
                    row[torch.tensor([t for t in p.allowed_token_ids if t < vocab], dtype=torch.long,
                                     device=self.device)] = 0.0
                entries = [(t, b) for t, b in p.logit_bias if t < vocab]
                if entries:
                    ids = torch.tensor([t for t, _ in entries], device=self.device)
                    row[ids] += torch.tensor([b for _, b in entries], device=self.device)
                if banned:
                    row[torch.tensor([t for t in banned if t < vocab], dtype=torch.long, device=self.device)] = NEG_INF
        self._pending.clear()
        return self._tables

    def active(self, seqs: Seq[Sequence]) -> bool:
        return any(s.seq_id in self._pending or s.seq_id in self._dynamic or self._has_rows(s.seq_id) for s in seqs)

    def _has_rows(self, seq_id: int) -> bool:
        return self._tables is not None and (seq_id in self._tables[0] or seq_id in self._tables[2])

    @torch.no_grad()  # (not inference mode: the tables are updated in place by later steps)
    def apply(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
        """logits [rows, vocab] (row i is seqs[i]'s) -> the controlled logits, a new float32 tensor; `logits` itself
        is returned unchanged when no row has a control."""
        if not self.active(seqs):
            return logits
        counts, prompt, bias = self._rows(logits.shape[-1])
        x = logits.to(torch.float32, copy=True)  # [rows, vocab]
        vocab = x.shape[-1]
        masked = [i for i, s in enumerate(seqs) if s.seq_id in bias]
        if masked:  # allowed_token_ids, one-token bad words, logit_bias: one row each, added
            rows = torch.tensor(masked, device=x.device)
            x.index_add_(0, rows, bias.data[bias.slots([seqs[i].seq_id for i in masked])])
        banned_rows: list[int] = []
        banned_ids: list[int] = []
        for i, s in enumerate(seqs):  # multi-token bad words and min_tokens look at the output so far
            d = self._dynamic.get(s.seq_id)
            if d is None:
                continue
            out = s.output_ids
            for before, last in d.prefixed:
                if len(out) >= len(before) and tuple(out[len(out) - len(before):]) == before and last < vocab:
                    banned_rows.append(i)
                    banned_ids.append(last)
            if len(out) < d.min_tokens:
                ids = [t for t in d.stops if t < vocab]
                banned_rows += [i] * len(ids)
                banned_ids += ids
        if banned_rows:
            x[torch.tensor(banned_rows, device=x.device), torch.tensor(banned_ids, device=x.device)] = NEG_INF
        penalized = [i for i, s in enumerate(seqs) if s.seq_id in counts]
        if penalized:
            self._penalize(x, penalized, [seqs[i] for i in penalized], counts, prompt)
        if masked or banned_rows:
            # a row that banned every token (allowed_token_ids inside its bad words as the output went on) keeps
            # its unmasked logits for this step rather than sampling from nothing
            dead = x.amax(-1) == NEG_INF  # [rows]
            if bool(dead.any()):
                x[dead] = logits[dead].float()
        return x

    @staticmethod
    def _penalize(x: torch.Tensor, rows: list[int], seqs: list[Sequence], counts: RowTable, prompt: RowTable) -> None:
        """vLLM's apply_penalties on rows `rows` of x: repetition over prompt and output tokens (as HF's
        RepetitionPenaltyLogitsProcessor), then frequency x count and presence x (count > 0) over output tokens."""
        params = [s.sampling for s in seqs]
        index = torch.tensor(rows, device=x.device)
        seq_ids = [s.seq_id for s in seqs]
        slots = counts.slots(seq_ids)
        sub = x[index]  # [P, vocab]
        n = counts.data[slots]  # [P, vocab] int32
        generated = n > 0
        if any(p.repetition_penalty != 1.0 for p in params):
            rep = torch.tensor([p.repetition_penalty for p in params], device=x.device)[:, None]  # [P, 1]
            seen = generated | prompt.data[prompt.slots(seq_ids)]
            sub = torch.where(seen, torch.where(sub < 0, sub * rep, sub / rep), sub)
        if any(p.frequency_penalty for p in params):
            freq = torch.tensor([p.frequency_penalty for p in params], device=x.device)[:, None]
            sub = sub - freq * n
        if any(p.presence_penalty for p in params):
            presence = torch.tensor([p.presence_penalty for p in params], device=x.device)[:, None]
            sub = sub - presence * generated
        if any(p.repetition_penalty < 1.0 for p in params):
            sub = sub.clamp(max=torch.finfo(sub.dtype).max)  # a tiny penalty can scale a logit past float's range
        x[index] = sub

    @torch.no_grad()
    def record(self, seqs: Seq[Sequence], tokens: Seq[int]) -> None:
        """Counts this step's tokens (one per row) for the penalized rows."""
        if self._tables is None:
            return
        counts = self._tables[0]
        hit = [(s.seq_id, t) for s, t in zip(seqs, tokens, strict=True) if s.seq_id in counts]
        if hit:
            slots = counts.slots([s for s, _ in hit])
            ids = torch.tensor([t for _, t in hit], device=self.device)
            counts.data[slots, ids] += 1
