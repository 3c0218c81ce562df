"""Iteration-level scheduler: which sequences the next forward runs. Never imports torch.

Each step is one decode position for every running sequence plus a prefill of newly admitted ones (their first
token comes out). Admission happens at every step boundary, so new requests join without waiting for running
ones; while sequences run, a step admits at most `mixed_prefill_tokens` prompt positions (at least one
sequence; counted padded to the longest, unless the family packs the step into one forward, where nothing is padded
and the prompts' own lengths are what it costs — their padded size still within `max_batch_tokens`, for the
two-forward fallback), so a wave of arrivals adds a bounded prefill to each step instead of stalling the running
streams for all of it; a prompt longer than that is admitted alone and prefilled `mixed_prefill_tokens` positions
per step (a PrefillChunk), and decodes once its last chunk is in. An idle engine admits up to `max_batch_tokens` at
once. Finished and aborted ones leave at the boundary they finish on.

A prompt whose beginning is in the prefix cache (`lookup`: the engine's, in positions; the scheduler sees only the
number) costs only the positions after it: its prefill starts there.

A request of n > 1 choices is one sequence until its prompt is in, then n (`fork`): it is admitted only where all n
fit in `max_running_seqs`, and the slots of the n - 1 others stay reserved until they start or it ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.sequence import FinishReason, SeqStatus, Sequence
from splice.errors import InvalidArgument, ResourceExhausted

DEFAULT_MIXED_PREFILL_TOKENS = 128  # on CPU a prompt position costs about what a decode row does: keep steps short
# On a GPU a step's cost hardly grows with a few hundred prompt positions beside the decode rows (the forward is
# bound by reading the weights), so a burst of arrivals is admitted in a step or two, not eight.
GPU_MIXED_PREFILL_TOKENS = 512


def mixed_prefill_default(gpu: bool) -> int:
    """--mixed-prefill-tokens when not given: by where the forward runs (a simulated forward stands for a GPU's)."""
    return GPU_MIXED_PREFILL_TOKENS if gpu else DEFAULT_MIXED_PREFILL_TOKENS


@dataclass(frozen=True)
class PrefillChunk:
    seq: Sequence  # RUNNING, not yet decoding
    start: int  # prompt positions already cached
    end: int  # prefill through this position (exclusive); the prompt's length on its last chunk


@dataclass(frozen=True)
class SchedulerOutput:
    prefill: list[Sequence] = field(default_factory=list)  # newly admitted, now RUNNING; prefill them
    decode: list[Sequence] = field(default_factory=list)  # running before this step; advance each by one token
    chunk: PrefillChunk | None = None  # the next part of a long prompt's prefill

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode and self.chunk is None

    @property
    def parts(self) -> list[PrefillChunk]:
        """This step's prompt positions: each admitted prompt whole (after its cached prefix), or the next part of a
        long one."""
        return [PrefillChunk(s, s.cached, s.prompt_len) for s in self.prefill] + ([self.chunk] if self.chunk else [])


class Scheduler:
    """Not thread-safe: the engine serializes calls."""

    def __init__(self, max_running_seqs: int, max_batch_tokens: int, max_queue: int,
                 mixed_prefill_tokens: int = DEFAULT_MIXED_PREFILL_TOKENS, packs_mixed_steps: bool = False,
                 lookup: Callable[[Sequence], int] | None = None) -> None:
        """`lookup`: prompt positions of a waiting sequence the prefix cache holds now (None: no prefix cache)."""
        self.max_running_seqs = max_running_seqs
        self.packs_mixed_steps = packs_mixed_steps
        self.max_batch_tokens = max_batch_tokens
        self.mixed_prefill_tokens = mixed_prefill_tokens
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefilling: Sequence | None = None  # running, its long prompt prefilled over several steps
        self.reserved = 0  # running slots promised to the other choices of admitted n > 1 requests, not yet started
        self.lookup = lookup

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def used(self) -> int:
        """Running slots taken or promised."""
        return len(self.running) + self.reserved

    def check_choices(self, n: int) -> None:
        """InvalidArgument when a request of `n` choices could never run here (before any work is spent on it)."""
        if n > self.max_running_seqs:
            raise InvalidArgument(f"n is {n}, but this engine runs at most {self.max_running_seqs} sequences at once "
                                  f"(--max-running-seqs), and all n choices of a request run together")

    def add(self, seq: Sequence) -> None:
        self.check_choices(seq.slots)
        if seq.prompt_len > self.max_batch_tokens:
            raise InvalidArgument(f"prompt has {seq.prompt_len} positions; this engine prefills at most "
                                  f"{self.max_batch_tokens} (--max-batch-tokens)")
        # max_queue counts requests beyond the running slots: those wait for a sequence to leave
        if len(self.running) + len(self.waiting) >= self.max_running_seqs + self.max_queue:
            raise ResourceExhausted(f"engine queue is full ({len(self.waiting)} waiting, {len(self.running)} "
                                    f"running); retry later")
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        decode = [s for s in self.running if s is not self.prefilling]
        budget = min(self.max_batch_tokens, self.mixed_prefill_tokens) if decode else self.max_batch_tokens
        if self.prefilling is not None:  # nothing else is admitted until its prompt is in
            seq = self.prefilling
            return SchedulerOutput(decode=decode, chunk=PrefillChunk(seq, seq.prefilled,
                                                                     min(seq.prompt_len, seq.prefilled + budget)))
        room = bool(self.waiting) and self.used + self.waiting[0].slots <= self.max_running_seqs
        cached = self._cached(self.waiting[0]) if room else 0
        if decode and room and self.waiting[0].prompt_len - cached > budget:  # its rest goes over several steps
            seq = self.prefilling = self.waiting.popleft()
            seq.prefilled = seq.cached = cached
            self._admit(seq)
            return SchedulerOutput(decode=decode, chunk=PrefillChunk(seq, cached, cached + budget))
        admitted: list[Sequence] = []
        longest = total = 0
        while self.waiting and self.used + self.waiting[0].slots <= self.max_running_seqs:
            seq = self.waiting[0]
            cached = self._cached(seq) if admitted else cached
            rest = seq.prompt_len - cached  # what its prefill costs: the positions after its cached prefix
            # prefill rows are padded to the longest prompt, so the padded size is what a prefill forward costs
            padded = max(longest, rest) * (len(admitted) + 1)
            cost = total + rest if decode and self.packs_mixed_steps else padded
            if admitted and (cost > budget or padded > self.max_batch_tokens):
                break
            seq.prefilled = seq.cached = cached
            self._admit(self.waiting.popleft())
            admitted.append(seq)
            longest = max(longest, rest)
            total += rest
        return SchedulerOutput(prefill=admitted, decode=decode)

    def _cached(self, seq: Sequence) -> int:
        return self.lookup(seq) if self.lookup is not None else 0

    def _admit(self, seq: Sequence) -> None:
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        self.reserved += len(seq.forks)

    def fork(self, seq: Sequence) -> list[Sequence]:
        """`seq`'s prompt is in: its other choices start now, RUNNING beside it in the slots reserved for them."""
        children, seq.forks = seq.forks, []
        self.reserved -= len(children)
        for child in children:
            child.status = SeqStatus.RUNNING
            child.prefilled = child.prompt_len
        self.running.extend(children)
        return children

    def chunk_done(self, seq: Sequence, end: int) -> None:
        """`seq`'s prompt is cached through `end`; at its length the sequence decodes from the next step."""
        seq.prefilled = end
        if end >= seq.prompt_len and seq is self.prefilling:
            self.prefilling = None

    def finish(self, seq: Sequence, reason: FinishReason, error: BaseException | None = None) -> None:
        """Ends `seq` wherever it is (waiting or running)."""
        if seq.is_finished:
            return
        if seq is self.prefilling:
            self.prefilling = None
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.reserved -= len(seq.forks)  # (choices that never started: finish() drops them)
        else:
            self.waiting.remove(seq)
        seq.finish(reason, error)

    def drain_aborts(self) -> list[Sequence]:
        """Finishes every sequence whose abort was requested; returns those that were running."""
        was_running = [s for s in self.running if s.abort_requested]
        for seq in [*was_running, *(s for s in self.waiting if s.abort_requested)]:
            self.finish(seq, FinishReason.ABORT)
        return was_running
