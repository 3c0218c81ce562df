"""The engine's ModelRunner driven by hand, as the engine drives it, with test-side sequence IDs: the engine keeps
each sequence's slot on its record; here a dict does (test bookkeeping only, the runner under test is the engine's).

    rows = Rows(family)
    first = rows.prefill([0, 1], [a, b])          # logits [2, vocab], in the caller's order
    step = rows.decode([t0, t1])                  # every row's last token, in `seq_ids` order (the order they joined)
    decoded, first = rows.mixed(tokens, [Part(2, c, 0, len(c.token_ids))])  # one packed forward
    rows.remove({0})
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine.model_runner import ModelRunner, PromptPart, RunnerOutput
from engine.models import Prompt
from engine.prompt_logprobs import PromptScores
from splice.prompt_logprobs import PromptLogprobs


class Part(NamedTuple):
    """Prompt positions [start, end) of sequence `seq_id`; `prompt` at its first part (None after: remembered)."""

    seq_id: int
    prompt: Prompt | None
    start: int
    end: int


class Rows:
    def __init__(self, family, capacity: tuple[int, int] | None = None, prefix=None) -> None:
        self.runner = ModelRunner(family, capacity, prefix)
        self.joined: list[int] = []  # the rows, in the order they joined
        self.slot: dict[int, int] = {}  # seq id -> its row's slot, or its columns' while its prompt is in parts
        self.pending: dict[int, Prompt] = {}  # prompts being prefilled over several steps
        self.scores: dict[int, PromptScores] = {}  # the prompt logprobs of the prompts that ask
        self.last: RunnerOutput | None = None  # what the last step's `execute` said
        self.moved: dict[int, int] = {}  # what the last `remove` said

    @property
    def seq_ids(self) -> list[int]:
        """The rows, in the order they joined (a copy)."""
        return list(self.joined)

    @property
    def batch(self):
        return self.runner.batch

    @property
    def slot_seqs(self) -> list[int]:
        """The sequence in each slot in use."""
        by_slot = {slot: s for s, slot in self.slot.items() if s in self.joined}
        return [by_slot[k] for k in range(self.runner.rows)]

    def run(self, tokens: list[int], parts: list[Part]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One step: `tokens` (in `seq_ids` order; none: the rows do not move) and `parts` -> (the rows' logits in
        `seq_ids` order, the logits of the parts whose prompt completed, in part order)."""
        by_slot = [0] * len(tokens)
        for s, t in zip(self.joined, tokens, strict=bool(tokens)):
            by_slot[self.slot[s]] = t
        plan = []
        for p in parts:
            prompt = p.prompt if p.prompt is not None else self.pending[p.seq_id]
            if prompt.prompt_logprobs is not None and p.seq_id not in self.scores:
                self.scores[p.seq_id] = PromptScores(prompt.token_ids.tolist())
            plan.append(PromptPart(prompt, p.start, p.end, self.slot.get(p.seq_id)))
            self.pending[p.seq_id] = prompt
        out = self.last = self.runner.execute(by_slot, plan)
        if out.failed:
            raise next(iter(out.failed.values()))
        for i, piece in out.scores:
            self.scores[parts[i].seq_id].add(piece)
        for i, slot in out.slots.items():
            self.slot[parts[i].seq_id] = slot
        rows = None
        if tokens:
            rows = out.logits[:len(tokens)][torch.tensor([self.slot[s] for s in self.joined])]
        joined = [parts[i].seq_id for i in sorted(out.done)]  # (in the caller's order, whatever their slots)
        for s in joined:
            del self.pending[s]
            self.joined.append(s)
            if s in self.scores:
                self.scores[s].finish()
        if out.logits is None:
            return rows, None
        first = out.logits[len(tokens):]  # (no rows when no prompt completed)
        order = [out.done.index(i) for i in range(len(parts)) if i in out.done]  # in part order
        return rows, first[torch.tensor(order, dtype=torch.long)]

    def prefill(self, seq_ids: list[int], prompts: list[Prompt]) -> torch.Tensor:
        """Whole prompts joining, the rows not moving -> their logits [len(prompts), vocab] in the caller's order."""
        return self.run([], [Part(s, p, 0, len(p.token_ids)) for s, p in zip(seq_ids, prompts, strict=True)])[1]

    def decode(self, tokens: list[int]) -> torch.Tensor:
        return self.run(tokens, [])[0]

    def mixed(self, tokens: list[int], parts: list[Part]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A decode of every row and `parts`, which must run as one packed forward."""
        rows, first = self.run(tokens, parts)
        assert self.last.packed, "the step did not run as one packed forward"
        return rows, first

    def take_prompt_logprobs(self, seq_id: int) -> PromptLogprobs | None:
        scores = self.scores.pop(seq_id, None)
        return scores.result if scores is not None else None

    def remove(self, seq_ids: set[int]) -> None:
        moved = self.moved = self.runner.remove([self.slot[s] for s in seq_ids if s in self.slot])
        for s in seq_ids:
            self.slot.pop(s, None)
            self.pending.pop(s, None)
            self.scores.pop(s, None)
        self.joined = [s for s in self.joined if s not in seq_ids]
        for s, slot in self.slot.items():
            self.slot[s] = moved.get(slot, slot)
        if not self.joined and not self.pending:
            self.runner.clear()
