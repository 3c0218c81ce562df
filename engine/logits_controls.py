"""Penalties and masks over a whole batch's logits, in vLLM's order (vllm/v1/sample/sampler.py): allowed_token_ids,
bad words, min_tokens, logit_bias, then the repetition, frequency and presence penalties.

State lives in tables of one row per sequence that asked for it ([slots, ..., vocab], grown as needed; the row's index
and what else the controls keep of it are on the sequence's record, a ControlsRow), kept up to date by a scatter or
two per step as tokens come out. A penalized sequence's row holds the factor of its
repetition penalty (the penalty at the tokens of its prompt and output so far, 1 elsewhere) and what its frequency
and presence penalties subtract so far; a masked sequence's row holds its fixed addition (logit_bias values, -inf
outside allowed_token_ids and at one-token bad words). A step gathers its sequences' rows and applies each control
to the whole batch in a few tensor ops (few, because each op also hands the GIL to the event loop's thread); the
Python work per step is a pass over the rows (and over each row's multi-token bad words and min_tokens stop IDs).
Each control acts on a row alone, so a row's result never depends on its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from engine.sequence import ControlsRow, Sequence

NEG_INF = float("-inf")
FACTOR, OFFSET = 0, 1  # the two channels of a penalty row


class RowTable:
    """A [slots, channels, vocab] float tensor whose rows belong to sequences (the row's index is on the sequence's
    ControlsRow, as `name`); grows by doubling, a freed row is reused. A new row holds `fill` (one value per
    channel)."""

    def __init__(self, vocab: int, device: torch.device, fill: tuple[float, ...], name: str) -> None:
        self.data = torch.zeros(0, len(fill), vocab, device=device)
        self.fill = torch.tensor(fill, device=device)[:, None]  # [channels, 1]
        self.name = name
        self._free: list[int] = []
        self._members: tuple[tuple[int, ...], list[int], torch.Tensor | None] | None = None  # the last batch's

    def add(self) -> int:
        """A new row, filled; returns its index."""
        if not self._free:
            old = self.data.shape[0]
            grown = self.data.new_empty(max(4, 2 * old), *self.data.shape[1:])
            grown[:old] = self.data
            self.data = grown
            self._free = list(range(grown.shape[0] - 1, old - 1, -1))
        slot = self._free.pop()
        self._members = None
        self.data[slot].copy_(self.fill.expand_as(self.data[slot]))
        return slot

    def free(self, slot: int) -> None:
        self._free.append(slot)
        self._members = None

    def members(self, seqs: Seq[Sequence]) -> tuple[list[int], torch.Tensor | None]:
        """(the positions in `seqs` of the sequences with a row, [those] long: their rows, None when none has).
        The same batch as last time gets the same tensor back."""
        key = tuple(s.seq_id for s in seqs)
        if self._members is not None and self._members[0] == key:
            return self._members[1], self._members[2]
        found = [(i, row) for i, s in enumerate(seqs)
                 if s.controls is not None and (row := getattr(s.controls, self.name)) is not None]
        rows = [i for i, _ in found]
        slots = torch.tensor([r for _, r in found], dtype=torch.long, device=self.data.device) if found else None
        self._members = (key, rows, slots)
        return rows, slots


class LogitsControls:
    """The tables of the penalties and masks; `apply` before sampling, `record` the tokens after. Used by the engine
    thread only."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # made at the first logits, as wide as they are
        self._penalty: RowTable | None = None  # [slots, (FACTOR, OFFSET), vocab] of penalized sequences
        self._bias: RowTable | None = None  # [slots, 1, vocab] of masked sequences
        self._live = 0  # sequences with a ControlsRow
        self._new: list[Sequence] = []  # started, their table rows not yet made
        self._channel = [torch.tensor(c, device=device) for c in (FACTOR, OFFSET)]  # index_put_ takes tensors

    def start(self, seq: Sequence, prompt_ids: Seq[int]) -> None:
        """`seq` decodes from now; `prompt_ids` are its prompt's token IDs (not the positions of supplied
        embeddings: those are no tokens). Its table rows are made at its first `apply`, when the vocabulary is
        known."""
        p = seq.sampling
        if not (p.penalized or p.masked or p.min_tokens or p.bad_words_token_ids):
            return
        prefixed = [(tuple(s[:-1]), s[-1]) for s in p.bad_words_token_ids if len(s) > 1]
        stops = tuple(dict.fromkeys((*seq.eos_token_ids, *p.stop_token_ids))) if p.min_tokens else ()
        seq.controls = ControlsRow(list(prompt_ids) if p.repetition_penalty != 1.0 else [], prefixed, stops)
        self._live += 1
        self._new.append(seq)

    def release(self, seq: Sequence) -> None:
        row, seq.controls = seq.controls, None
        if row is None:
            return
        self._live -= 1
        self._new = [s for s in self._new if s is not seq]
        if row.penalty is not None:
            self._penalty.free(row.penalty)
        if row.bias is not None:
            self._bias.free(row.bias)

    def _make_rows(self, vocab: int) -> None:
        if self._penalty is None:
            self._penalty = RowTable(vocab, self.device, fill=(1.0, 0.0), name="penalty")
            self._bias = RowTable(vocab, self.device, fill=(0.0,), name="bias")

        def ids(tokens) -> torch.Tensor:
            return torch.tensor([t for t in tokens if t < vocab], dtype=torch.long, device=self.device)

        for seq in self._new:
            p, state = seq.sampling, seq.controls
            if p.penalized:
                state.penalty = self._penalty.add()
                self._penalty.data[state.penalty, FACTOR, ids(state.prompt_ids)] = p.repetition_penalty
                state.prompt_ids = []
            if p.masked:
                state.bias = self._bias.add()
                row = self._bias.data[state.bias, 0]
                if p.allowed_token_ids:
                    row.fill_(NEG_INF)[ids(p.allowed_token_ids)] = 0.0
                entries = [(t, b) for t, b in p.logit_bias if t < vocab]
                if entries:
                    row[ids(t for t, _ in entries)] += torch.tensor([b for _, b in entries], device=self.device)
                row[ids(s[0] for s in p.bad_words_token_ids if len(s) == 1)] = NEG_INF
        self._new = []

    @torch.no_grad()  # (not inference mode: the tables are updated in place by later steps)
    def apply(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
        """logits [rows, vocab] (row i is seqs[i]'s) -> the controlled logits, a new float32 tensor; `logits` itself
        is returned unchanged when no row has a control."""
        if not self._live or all(s.controls is None for s in seqs):
            return logits
        self._make_rows(logits.shape[-1])
        bias_rows, bias_slots = self._bias.members(seqs)
        bans = self._bans(seqs, logits.shape[-1])
        # a copy to change in place, unless the penalties cover every row (they make a new tensor)
        rows, slots = self._penalty.members(seqs)
        whole = slots is not None and len(rows) == len(seqs)
        x = logits.float() if whole and bias_slots is None and bans is None else logits.to(torch.float32, copy=True)
        if bias_slots is not None:  # allowed_token_ids, one-token bad words, logit_bias
            self._add(x, bias_rows, self._bias.data.index_select(0, bias_slots)[:, 0])
        if bans is not None:  # multi-token bad words, min_tokens
            x[bans] = NEG_INF
        if slots is not None:
            x = self._penalize(x, seqs, rows, self._penalty.data.index_select(0, slots))
        if bias_slots is not None or bans is not None:
            # a row that banned every token (allowed_token_ids inside its bad words as the output went on) keeps
            # its unmasked logits for this step rather than sampling from nothing
            dead = x.amax(-1) == NEG_INF  # [rows]
            if bool(dead.any()):
                x[dead] = logits[dead].float()
        return x

    @staticmethod
    def _add(x: torch.Tensor, rows: list[int], values: torch.Tensor) -> None:
        """x[rows] += values [len(rows), vocab], in place."""
        if len(rows) == x.shape[0]:
            x += values
        else:
            x.index_add_(0, torch.tensor(rows, device=x.device), values)

    @staticmethod
    def _penalize(x: torch.Tensor, seqs: Seq[Sequence], rows: list[int], penalty: torch.Tensor) -> torch.Tensor:
        """Repetition (as HF's RepetitionPenaltyLogitsProcessor: x * p below 0, x / p above; a factor of 1 leaves x
        exactly as it is), then frequency x count + presence x (count > 0); penalty [P, 2, vocab]."""
        whole = len(rows) == len(seqs)
        index = None if whole else torch.tensor(rows, device=x.device)
        sub = x if whole else x.index_select(0, index)  # [P, vocab]
        factor = penalty[:, FACTOR]
        # HF's where(x < 0, x * p, x / p) as a sum in which one term is 0 (-inf stays -inf), plus the offset
        sub = torch.addcdiv(torch.addcmul(penalty[:, OFFSET], sub.clamp(max=0), factor), sub.clamp(min=0), factor)
        if any(seqs[i].sampling.repetition_penalty < 1.0 for i in rows):
            sub = sub.clamp(max=torch.finfo(sub.dtype).max)  # a tiny penalty can scale a logit past float's range
        if whole:
            return sub
        x[index] = sub
        return x

    def _bans(self, seqs: Seq[Sequence], vocab: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (rows, token IDs) to set to -inf: the last token of each bad word whose other tokens end the output,
        and the stop IDs of rows still under min_tokens (vLLM: the output only, never the prompt); None if none."""
        rows: list[int] = []
        ids: list[int] = []
        for i, s in enumerate(seqs):
            state = s.controls
            if state is None or not (state.prefixed or state.stops):
                continue
            out = s.output_ids
            for before, last in state.prefixed:
                if len(out) >= len(before) and tuple(out[len(out) - len(before):]) == before and last < vocab:
                    rows.append(i)
                    ids.append(last)
            if len(out) < s.sampling.min_tokens:
                stops = [t for t in state.stops if t < vocab]
                rows += [i] * len(stops)
                ids += stops
        if not rows:
            return None
        return torch.tensor(rows, device=self.device), torch.tensor(ids, device=self.device)

    @torch.no_grad()
    def record(self, seqs: Seq[Sequence], tokens: Seq[int]) -> None:
        """This step's tokens (one per row) into the penalty rows: the token is now seen (the repetition factor) and
        counted (the frequency penalty; the presence penalty the first time)."""
        if self._penalty is None:
            return
        rows, slots = self._penalty.members(seqs)
        if slots is None:
            return
        factors, minus = [], []
        for i in rows:
            p, generated = seqs[i].sampling, seqs[i].controls.generated
            factors.append(p.repetition_penalty)
            minus.append(-p.frequency_penalty - (p.presence_penalty if tokens[i] not in generated else 0.0))
            generated.add(tokens[i])
        ids = torch.tensor([tokens[i] for i in rows], dtype=torch.long, device=self.device)
        values = torch.tensor([factors, minus], device=self.device)  # [2, P]
        data = self._penalty.data
        data.index_put_((slots, self._channel[FACTOR], ids), values[FACTOR])
        data.index_put_((slots, self._channel[OFFSET], ids), values[OFFSET], accumulate=True)
