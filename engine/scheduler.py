"""Iteration-level scheduler: which sequences the next forward runs (`schedule`), and what the step did to them
(`update`, as vLLM's update_from_output and nano-vllm's postprocess). Never imports torch.

Each step is one decode position for every running sequence plus a prefill of newly admitted ones (their first
token comes out). Admission happens at every step boundary, so new requests join without waiting for running
ones; while sequences run, a step admits at most `mixed_prefill_tokens` prompt positions (at least one
sequence; counted padded to the longest, unless the family packs the step into one forward, where nothing is padded
and the prompts' own lengths are what it costs — their padded size still within `max_batch_tokens`, for the
two-forward fallback), so a wave of arrivals adds a bounded prefill to each step instead of stalling the running
streams for all of it; a prompt longer than that is prefilled `mixed_prefill_tokens` positions per step (a Span of
it, the step's last), and decodes once its last part is in; meanwhile whole prompts of up to half a step's positions
are admitted beside its parts, passing longer ones in the queue (vLLM's short prompts passing a long partial
prefill), so one long prompt does not hold every later arrival back for all of its prefill. An idle engine admits up
to `max_batch_tokens` at once, but a long prompt that asks for prompt logprobs goes in parts there too: each part's
positions also run through the vocabulary projection, and bounded parts keep other users' steps short. Finished
and aborted ones leave at the boundary they finish on. A running sequence whose request's reader fell behind
(`Sequence.paused`, engine/flow.py) is left out of the decode, keeping its slot, until the reader catches up.

A prompt whose beginning is in the prefix cache (`lookup`: the engine's, in positions; the scheduler sees only the
number) costs only the positions after it: its prefill starts there.

With LoRA adapters, the running sequences run under at most `max_loras` distinct adapters (--max-loras: a step's
forward batches that many): a waiting sequence whose adapter would be one too many waits, and those behind it that fit
are admitted before it.

A request of n > 1 choices is one sequence until its prompt is in, then n (`update` starts them): it is admitted only
where all n fit in `max_running_seqs`, and the slots of the n - 1 others stay reserved until they start or it ends.

After each step `update` records what it gave (a StepOutput, plain values): every sampled row's token (a sequence
ends on a stop ID, max_tokens, the context, or a complete grammar), each prompt's progress (`Sequence.computed`, the
one counter of how far a sequence is: a long prompt's next part starts there), and the choices that start.
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
class Span:
    seq: Sequence  # RUNNING, its prompt not yet all computed
    start: int  # prompt positions already computed (its cached prefix, or its parts so far)
    end: int  # computed through this position (exclusive); the prompt's length on its last part


@dataclass(frozen=True)
class SchedulerOutput:
    decode: list[Sequence] = field(default_factory=list)  # running before this step; each computes one position more
    # this step's prompt positions: the prompts admitted in it, whole (after their cached prefix), or the next part of
    # a long one (then alone)
    prefill: list[Span] = field(default_factory=list)
    # running, their prompt in, but not decoded in this step: their request's reader is behind (Sequence.paused); they
    # keep their slots and decode again once it reads
    paused: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode


@dataclass
class StepOutput:
    """What a step gave, for `Scheduler.update` (no tensors)."""

    done: list[Sequence]  # the prompts completed in it (a long prompt's may end past its span: prefilled whole)
    rows: list[Sequence]  # the rows sampled: the decoding ones, the completed prompts and their other choices
    tokens: list[int]  # each row's token
    logprobs: list[float | None]  # its logprob, for rows that asked
    stops: set[int]  # rows whose structured output is complete: they end (stop)


class Scheduler:
    """Not thread-safe: the engine serializes calls."""

    def __init__(self, max_running_seqs: int, max_batch_tokens: int, max_queue: int,
                 mixed_prefill_tokens: int = DEFAULT_MIXED_PREFILL_TOKENS, packs_mixed_steps: bool = False,
                 lookup: Callable[[Sequence], int] | None = None, max_loras: int | None = None,
                 max_seqs_per_request: int | None = None) -> None:
        """`lookup`: prompt positions of a waiting sequence the prefix cache holds now (None: no prefix cache);
        `max_loras`: distinct adapters the running sequences may have (None: LoRA off); `max_seqs_per_request`: the
        most choices one request may hold (None: `max_running_seqs`)."""
        self.max_running_seqs = max_running_seqs
        self.max_seqs_per_request = max_seqs_per_request
        self.packs_mixed_steps = packs_mixed_steps
        self.max_batch_tokens = max_batch_tokens
        self.mixed_prefill_tokens = mixed_prefill_tokens
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.reserved = 0  # running slots promised to the other choices of admitted n > 1 requests, not yet started
        self.lookup = lookup
        self.max_loras = max_loras

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def used(self) -> int:
        """Running slots taken or promised."""
        return len(self.running) + self.reserved

    def check_choices(self, n: int) -> None:
        """InvalidArgument when a request of `n` choices could never run here (before any work is spent on it)."""
        if self.max_seqs_per_request is not None and n > self.max_seqs_per_request:
            raise InvalidArgument(f"n is {n}, but one request may hold at most {self.max_seqs_per_request} sequences "
                                  f"on this engine (--max-seqs-per-request)")
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

    @property
    def prefilling(self) -> Sequence | None:
        """The running sequence whose long prompt is being prefilled over several steps, if any."""
        return next((s for s in self.running if s.prefilling), None)

    def schedule(self) -> SchedulerOutput:
        decode, paused = [], []
        for s in self.running:
            if not s.prefilling:
                (paused if s.paused else decode).append(s)
        mixed = min(self.max_batch_tokens, self.mixed_prefill_tokens)
        budget = mixed if decode else self.max_batch_tokens
        part = self.prefilling
        head = self._head()
        room = head is not None and self.used + head.slots <= self.max_running_seqs
        cached = self._cached(head) if room and part is None else 0
        if part is None and room and head.prompt_len - cached > mixed and (
                decode or head.sampling.prompt_logprobs is not None):  # its rest goes over several steps
            part = head
            self._admit(part, cached)
        if part is not None:
            return self._beside_part(part, decode, paused, budget, mixed)
        admitted: list[Span] = []
        longest = total = 0
        while (seq := self._head()) is not None and self.used + seq.slots <= self.max_running_seqs:
            cached = self._cached(seq) if admitted else cached
            rest = seq.prompt_len - cached  # what its prefill costs: the positions after its cached prefix
            # prefill rows are padded to the longest prompt, so the padded size is what a prefill forward costs
            padded = max(longest, rest) * (len(admitted) + 1)
            cost = total + rest if decode and self.packs_mixed_steps else padded
            if admitted and (cost > budget or padded > self.max_batch_tokens or (
                    rest > mixed and seq.sampling.prompt_logprobs is not None)):  # (that one goes in parts, first)
                break
            self._admit(seq, cached)
            admitted.append(Span(seq, cached, seq.prompt_len))
            longest = max(longest, rest)
            total += rest
        return SchedulerOutput(decode, admitted, paused)

    def _beside_part(self, part: Sequence, decode: list[Sequence], paused: list[Sequence], budget: int,
                     mixed: int) -> SchedulerOutput:
        """A step while `part`'s long prompt is prefilled over several: whole waiting prompts that fit in half the
        step's prompt positions pass it (in queue order, longer ones keep their place: vLLM lets short prompts pass a
        long partial prefill), then its next part takes the rest (last, after theirs). A part is `mixed` positions
        while sequences decode, or when its positions are also scored for prompt logprobs (bounded chunks of the
        vocabulary projection); an idle engine prefills an unscored one's rest at once."""
        size = mixed if decode or part.sampling.prompt_logprobs is not None else budget
        admitted: list[Span] = []
        longest = total = cost = 0
        for seq in list(self.waiting):
            if self.used + seq.slots > self.max_running_seqs:
                break
            if seq.prompt_len > size // 2 or not self._adapter_fits(seq):  # (a long one waits its turn, even when
                continue  # a cached prefix makes its rest shorter)
            cached = self._cached(seq)
            rest = seq.prompt_len - cached
            padded = max(longest, rest) * (len(admitted) + 1)
            new_cost = total + rest if decode and self.packs_mixed_steps else padded
            if new_cost > size // 2:
                break
            self._admit(seq, cached)
            admitted.append(Span(seq, cached, seq.prompt_len))
            longest, total, cost = max(longest, rest), total + rest, new_cost
        end = min(part.prompt_len, part.computed + size - cost)
        return SchedulerOutput(decode, [*admitted, Span(part, part.computed, end)], paused)

    def _cached(self, seq: Sequence) -> int:
        return self.lookup(seq) if self.lookup is not None else 0

    def _head(self) -> Sequence | None:
        """The next waiting sequence to admit: the first, or with adapters the first whose adapter may run beside the
        running ones' (max_loras)."""
        if self.max_loras is None:
            return self.waiting[0] if self.waiting else None
        active = {s.adapter for s in self.running if s.adapter is not None}
        full = len(active) >= self.max_loras
        return next((s for s in self.waiting if s.adapter is None or not full or s.adapter in active), None)

    def _adapter_fits(self, seq: Sequence) -> bool:
        """Whether `seq`'s adapter may run beside the running sequences' (max_loras; always with LoRA off)."""
        if self.max_loras is None or seq.adapter is None:
            return True
        active = {s.adapter for s in self.running if s.adapter is not None}
        return seq.adapter in active or len(active) < self.max_loras

    def _admit(self, seq: Sequence, cached: int) -> None:
        if self.waiting[0] is seq:
            self.waiting.popleft()
        else:
            self.waiting.remove(seq)
        seq.status = SeqStatus.RUNNING
        seq.computed = seq.cached = cached
        self.running.append(seq)
        self.reserved += len(seq.forks)

    def update(self, out: SchedulerOutput, step: StepOutput) -> list[Sequence]:
        """After `out` ran: each prompt is as far as its span (a completed one, all of it: its other choices start,
        RUNNING beside it in the slots reserved for them), each decoding row one position further, and every sampled
        row takes its token. Returns the sequences that end here (stop or length). A sequence finished while the step
        ran (its prefill failed) stays as it ended."""
        for span in out.prefill:
            span.seq.computed = span.end
        for seq in out.decode:
            seq.computed += 1
        for seq in step.done:
            seq.computed = seq.prompt_len
            children, seq.forks = seq.forks, []
            self.reserved -= len(children)
            for child in children:
                child.status = SeqStatus.RUNNING
                child.computed = child.cached = seq.prompt_len
            self.running.extend(children)
        ended: list[Sequence] = []
        for k, (seq, token, logprob) in enumerate(zip(step.rows, step.tokens, step.logprobs, strict=True)):
            reason = seq.append(token, logprob)
            if reason is None and k in step.stops:
                reason = FinishReason.STOP
            if reason is not None:
                self.finish(seq, reason)
                ended.append(seq)
        return ended

    def finish(self, seq: Sequence, reason: FinishReason, error: BaseException | None = None) -> None:
        """Ends `seq` wherever it is (waiting or running)."""
        if seq.is_finished:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.reserved -= len(seq.forks)  # (choices that never started: finish() drops them)
        else:
            self.waiting.remove(seq)
        seq.finish(reason, error)

    def drain_aborts(self) -> list[Sequence]:
        """Finishes every sequence whose abort was requested (running or waiting) and returns them."""
        aborted = [s for s in (*self.running, *self.waiting) if s.abort_requested]
        for seq in aborted:
            self.finish(seq, FinishReason.ABORT)
        return aborted
