"""One request's generation state: a small state machine with counters. No torch."""

from __future__ import annotations

import enum
import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

from splice.engine_output import FinishReason
from splice.sampling import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # queued, not yet prefilled
    RUNNING = "running"  # prefilled; its KV cache is a row of the running batch
    FINISHED = "finished"  # left the batch; `finish_reason` says why


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    request_id: str  # caller's ID, for logs; not unique
    prompt_len: int  # prompt positions (text, image and embedding positions alike)
    sampling: SamplingParams
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()
    payload: Any = None  # runner-side input (the EngineRequest); opaque to the scheduler
    seq_id: int = field(default_factory=lambda: next(_ids))  # unique within the process
    status: SeqStatus = SeqStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: BaseException | None = None
    abort_requested: bool = False  # set by any thread; the engine drains it between steps
    grammar: Any = None  # its structured output's compiled grammar (engine/grammar_masks.py makes its matcher)
    prefilled: int = 0  # prompt positions already cached (a long prompt admitted while others run fills in steps)
    cached: int = 0  # of those, the positions read from the prefix cache at admission (its prefill starts there)
    cache_keys: Any = None  # engine/prefix_cache.py PrefixKeys of its prompt, kept past its prefill (opaque here)
    index: int = 0  # which of its request's n choices this is (SamplingParams.n)
    # the request's other choices (n > 1), made with it and queued nowhere: they start from its prefill (a copy of its
    # row) and then run on their own; emptied when they start (Scheduler.fork) or it ends before they could
    forks: list[Sequence] = field(default_factory=list)

    @property
    def num_generated(self) -> int:
        return len(self.output_ids)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.num_generated

    @property
    def max_new_tokens(self) -> int:
        room = self.max_model_len - self.prompt_len
        return room if self.sampling.max_tokens is None else min(room, self.sampling.max_tokens)

    @property
    def slots(self) -> int:
        """Running slots the sequence needs: its own, and those of the choices it forks into after its prefill."""
        return 1 + len(self.forks)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    @functools.cached_property
    def stop_ids(self) -> frozenset[int]:
        """(Read once per generated token; the sampling parameters never change.)"""
        eos = () if self.sampling.ignore_eos else self.eos_token_ids
        return frozenset((*eos, *self.sampling.stop_token_ids))

    def append(self, token: int, logprob: float | None = None) -> FinishReason | None:
        """Records one generated token; returns why the sequence ends now, if it does."""
        self.output_ids.append(token)
        if logprob is not None:
            self.logprobs.append(logprob)
        if token in self.stop_ids:
            return FinishReason.STOP
        if self.num_generated >= self.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def finish(self, reason: FinishReason, error: BaseException | None = None) -> None:
        self.status = SeqStatus.FINISHED
        self.finish_reason = reason
        self.error = error
        self.payload = None  # drop tensors as soon as the sequence leaves
        self.forks = []  # choices that had not started never will
