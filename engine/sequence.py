"""One request's record in the engine: a small state machine with counters, and everything the engine keeps of the
request while it lives (its prompt while it is prefilled, its slot, its sampling state, where its outputs go). The
scheduler reads the state and the counters only, so this module never imports torch (the fields' types are named
for the reader, not imported at run time)."""

from __future__ import annotations

import enum
import functools
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from splice.engine_output import FinishReason
from splice.sampling import SamplingParams

if TYPE_CHECKING:
    import torch
    import xgrammar as xgr

    from engine.flow import Flow
    from engine.lora import LoraAdapter
    from engine.models.base import Prompt
    from engine.outbox import Listener
    from engine.prefix_cache import PrefixKeys
    from engine.prompt_logprobs import PromptScores
    from splice.engine_request import EngineRequest


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # queued, not yet prefilled
    RUNNING = "running"  # admitted: its prompt is being prefilled (`prefilling`), then it decodes in every step
    FINISHED = "finished"  # left the batch; `finish_reason` says why


_ids = itertools.count()


@dataclass
class ControlsRow:
    """What the penalties and masks (engine/logits_controls.py) keep of one sequence: its rows in their tables and
    what the rows are made of."""

    prompt_ids: list[int]  # its prompt's token IDs, until its penalty row is made
    prefixed: list[tuple[tuple[int, ...], int]]  # multi-token bad words: (the tokens before, the banned last token)
    stops: tuple[int, ...]  # banned while fewer than min_tokens are out: EOS and stop_token_ids
    generated: set[int] = field(default_factory=set)  # tokens out so far (a presence penalty's first time)
    penalty: int | None = None  # its row of the penalty table, once made
    bias: int | None = None  # its row of the bias table, once made


@dataclass(eq=False)
class Sequence:
    request_id: str  # caller's ID, for logs; not unique
    prompt_len: int  # prompt positions (text, image and embedding positions alike)
    sampling: SamplingParams
    max_model_len: int
    eos_token_ids: tuple[int, ...] = ()
    request: EngineRequest | None = None  # what the prompt is made of, until its prompt is in (tensors go with it)
    seq_id: int = field(default_factory=lambda: next(_ids))  # unique within the process
    status: SeqStatus = SeqStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: BaseException | None = None
    abort_requested: bool = False  # set by any thread; the engine drains it between steps
    index: int = 0  # which of its request's n choices this is (SamplingParams.n)
    # the request's other choices (n > 1), made with it and queued nowhere: they start from its prefill (a copy of its
    # row) and then run on their own; emptied when they start (Scheduler.update) or it ends before they could
    forks: list[Sequence] = field(default_factory=list)
    # --- progress: the one counter of how far it is ---
    computed: int = 0  # positions whose keys and values are cached: its prompt's as they are prefilled, then one more
    # per step it decodes (the token sampled last is always the one not yet computed)
    cached: int = 0  # of the prompt's, those the prefix cache gave it at admission (its prefill starts there)
    # --- what the runner needs (engine/model_runner.py) ---
    prompt: Prompt | None = None  # its merged prompt, made at its first part, until its prompt is in
    slot: int | None = None  # its row's slot in the batch (while its prompt is prefilled in parts: its columns')
    prefix_keys: PrefixKeys | None = None  # the prefix cache's keys of its prompt's whole blocks (None: not cached)
    adapter: LoraAdapter | None = None  # the LoRA adapter it runs under (engine/lora/); None: the base model
    # --- sampling state, made when its prompt is in (engine/sampler.py Sampler.start) ---
    grammar: xgr.CompiledGrammar | None = None  # its structured output's compiled grammar
    matcher: xgr.GrammarMatcher | None = None  # where its output is in that grammar (engine/grammar_masks.py)
    generator: torch.Generator | None = None  # its own, seeded: its draws do not depend on its neighbours
    controls: ControlsRow | None = None  # its penalties' and masks' state (engine/logits_controls.py)
    prompt_scores: PromptScores | None = None  # its prompt logprobs, when it asked (engine/prompt_logprobs.py)
    # --- its caller ---
    arrival: float = 0.0  # time.perf_counter() when it arrived: its time to first token counts from here
    listener: Listener | None = None  # where its outputs go (engine/outbox.py); None once its caller stopped listening
    flow: Flow | None = None  # how far its request's reader is behind (engine/flow.py), shared by its choices

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
    def prefilling(self) -> bool:
        """Its prompt is not all computed yet."""
        return self.computed < self.prompt_len

    @property
    def paused(self) -> bool:
        """Its request's reader is --max-unread-tokens behind: it is not decoded until the reader catches up."""
        return self.flow is not None and self.flow.behind

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
        self.request = self.prompt = None  # drop tensors as soon as the sequence leaves
        self.forks = []  # choices that had not started never will
