"""Iteration-level scheduler: which sequences the next forward runs. Never imports torch.

Each step is either a prefill of newly admitted sequences (their first token comes out) or one decode
position for every running sequence. Admission happens at every step boundary, so new requests join
without waiting for running ones; finished and aborted ones leave at the boundary they finish on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.sequence import FinishReason, SeqStatus, Sequence
from splice.errors import InvalidArgument, ResourceExhausted


@dataclass(frozen=True)
class SchedulerOutput:
    prefill: list[Sequence] = field(default_factory=list)  # newly admitted, now RUNNING; prefill them
    decode: list[Sequence] = field(default_factory=list)  # running; advance each by one token

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    """Not thread-safe: the engine serializes calls."""

    def __init__(self, max_running_seqs: int, max_batch_tokens: int, max_queue: int) -> None:
        self.max_running_seqs = max_running_seqs
        self.max_batch_tokens = max_batch_tokens
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
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
        admitted: list[Sequence] = []
        longest = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_running_seqs:
            seq = self.waiting[0]
            # prefill rows are padded to the longest prompt, so the padded size is what the forward costs
            padded = max(longest, seq.prompt_len) * (len(admitted) + 1)
            if admitted and padded > self.max_batch_tokens:
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            admitted.append(seq)
            longest = max(longest, seq.prompt_len)
        if admitted:
            self.running.extend(admitted)
            return SchedulerOutput(prefill=admitted)
        return SchedulerOutput(decode=list(self.running))

    def finish(self, seq: Sequence, reason: FinishReason, error: BaseException | None = None) -> None:
        """Ends `seq` wherever it is (waiting or running)."""
        if seq.is_finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.finish(reason, error)

    def drain_aborts(self) -> list[Sequence]:
        """Finishes every sequence whose abort was requested; returns those that were running."""
        was_running = [s for s in self.running if s.abort_requested]
        for seq in [*was_running, *(s for s in self.waiting if s.abort_requested)]:
            self.finish(seq, FinishReason.ABORT)
        return was_running
