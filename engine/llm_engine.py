"""The engine: schedule -> execute -> sample -> update -> hand off, on a dedicated thread; an asyncio API on top.

    engine = LLMEngine(EngineConfig(model=folder)); engine.start(); await engine.warmup()
    async for out in engine.generate(request): ...      # EngineOutput per step (merged if the reader lags)
    engine.abort(request_id)                            # or just stop iterating / cancel the task

Torch runs only on the engine thread, so the event loop (health checks, cancellations, new requests)
never waits for a forward. Aborts are drained at every step boundary, before the next forward. A step's
outputs reach each event loop in one hand-off (engine/outbox.py), not one per token. A request's state lives on
its record (engine/sequence.py), released in one place (`_release`); docs/engine.md tells its life step by step.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import threading
import time
from collections.abc import AsyncIterator

import torch
from transformers import AutoTokenizer

from engine import fork
from engine.config import EngineConfig
from engine.flow import Flow
from engine.loader import LoadedModel, load
from engine.lora import LoraAdapter
from engine.lora.served import ServedLoras
from engine.metrics import EngineStats, NoStats
from engine.model_runner import ModelRunner, PromptPart, RunnerOutput, batch_capacity
from engine.models import Prompt
from engine.outbox import Listener, Outbox, Waiters
from engine.pauses import Pauses, arrange
from engine.prefix_cache import PrefixKeys, for_engine, request_keys
from engine.prompt_logprobs import PromptScores
from engine.sampler import Sampler, Top
from engine.scheduler import Scheduler, SchedulerOutput, StepOutput, mixed_prefill_default
from engine.sequence import Sequence
from engine.step_threads import PREFILL_STEP_AT, StepThreads
from engine.tensor_parallel import Ranks
from engine.validate import validate_request
from splice import heap
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.engine_request import EngineRequest
from splice.errors import DeadlineExceeded, SpliceError, Unavailable
from splice.grammar_cache import GrammarCache
from splice.model_info import ModelInfo
from splice.offload import inline_or_thread
from splice.sampling import SamplingParams

# A request without tensors and up to this many tokens is validated on the event loop: checking its IDs takes
# less time (~60 ns per ID) than a thread's hand-off (splice/offload.py).
INLINE_VALIDATE_TOKENS = 4096

log = logging.getLogger(__name__)
DEFAULT_BATCH_TOKENS = 8192
NORMAL_ENDS = (FinishReason.STOP, FinishReason.LENGTH)


class Cancelled(SpliceError):
    """The sequence was aborted through `LLMEngine.abort` while its caller still listened."""

    code = "CANCELLED"


class LLMEngine:
    def __init__(self, cfg: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.cfg = cfg
        # Tensor parallelism: the other ranks start and join first, then every rank loads its shard.
        self.ranks = Ranks(cfg.tensor_parallel_size, cfg) if cfg.tensor_parallel_size > 1 else None
        self.m = loaded if loaded is not None else load(cfg)
        self.prefix = for_engine(cfg, self.m.family)
        self.threads = (StepThreads(cfg.torch_threads, cfg.compute_threads)
                        if cfg.torch_threads and cfg.compute_threads and cfg.compute_threads > cfg.torch_threads
                        and self.m.device.type == "cpu" and cfg.tensor_parallel_size == 1 else None)
        if self.threads is not None:
            log.info("matrix products, and steps of %d prompt positions or more, on %d torch threads",
                     PREFILL_STEP_AT, self.threads.compute)
        self.runner = ModelRunner(self.m.family, batch_capacity(cfg.max_running_seqs, self.m.info.max_model_len),
                                  self.prefix, self.threads)
        self.family = self.m.family  # its prompt() is a model call: the runner's and its run on every rank
        if self.ranks is not None:
            self.runner, self.family = self.ranks.wrap(self.runner, self.family, self.m.device)
        budget = cfg.max_batch_tokens or max(DEFAULT_BATCH_TOKENS, self.m.info.max_model_len, cfg.max_running_seqs)
        mixed = cfg.mixed_prefill_tokens or mixed_prefill_default(self.m.device.type == "cuda"
                                                                  or cfg.simulate_forward_ms is not None)
        self.loras = ServedLoras(cfg, self.m)  # the LoRA adapters served (none: LoRA off)
        self.scheduler = Scheduler(cfg.max_running_seqs, budget, cfg.max_queue, mixed,
                                   self.family.packs_mixed_steps, self._cached if self.prefix is not None else None,
                                   cfg.max_loras if cfg.enable_lora else None, cfg.max_seqs_per_request)
        # reset_prefix_cache calls waiting for the engine thread
        self._resets = Waiters()
        self._lock = threading.Lock()  # guards the scheduler, the records' table and their listeners
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.requests: dict[int, Sequence] = {}  # seq_id -> every live sequence's record: the engine's one table
        self._paused = Pauses(cfg.unread_timeout)  # requests paused at the last schedule: readers behind (pauses.py)
        # The forward runs on a device (a GPU, or simulated): a launch returns at once and the host waits only when it
        # samples, so a step's outputs are handed over after the next forward's launch, while it runs, instead of
        # taking the GIL and the cores from the host work that prepares it. On CPU the forward is that host work: no
        # step waits for the next one's forward to hand its outputs over.
        self._overlap = self.m.device.type == "cuda" or cfg.simulate_forward_ms is not None
        self._outbox = Outbox()  # this step's outputs, handed to the event loops once per step
        self.sampler = Sampler(self.m.device)
        self._grammars: GrammarCache | None = None  # compiled structured outputs; made at the first one
        self._logits_width: int | None = None  # the logits' vocabulary (grammars are compiled for it)
        self.steps = 0  # forwards run; tests and metrics read it
        self.packed_steps = 0  # of those, mixed steps run as one packed forward
        self.stats: EngineStats = EngineStats()  # Prometheus recording, per step or per request

    @property
    def info(self) -> ModelInfo:
        return self.m.info

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="splice-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops the loop; sequences still in flight end with UNAVAILABLE."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.runner.clear()
        if self.threads is not None:
            self.threads.close()
        self._resets.answer()  # (asked for as it stopped: nothing is cached any more that matters)
        if self._grammars is not None:
            self._grammars.close()
            self._grammars = None
        if self.ranks is not None:
            self.ranks.stop()
            self.ranks = None
        self._fail(list(self.requests.values()), Unavailable("engine stopped"))

    async def warmup(self) -> None:
        """One tiny greedy request through the whole path (allocations, kernels) before serving."""
        req = EngineRequest("warmup", [0] * 4, sampling=SamplingParams(temperature=0.0, max_tokens=2))
        stats, self.stats = self.stats, NoStats()  # not a user request: keep it out of the metrics
        try:
            async for _ in self.generate(req):
                pass
        finally:
            self.stats = stats

    # --- async API -------------------------------------------------------------------------------

    def _check(self, req: EngineRequest, adapter: LoraAdapter | None = None) -> PrefixKeys | None:
        """Validation, then the encoder cache's and the prefix cache's content keys (hashing every pixel byte, like
        the finite checks beside it, not on the engine loop) -> the prefix cache's (None: no cache). Under an adapter
        the prefix keys are its own, and so are the encoder cache's where it adapts the vision tower or connector."""
        validate_request(req, self.m.info, self.m.family.images)
        req.image_keys = self.m.family.image_keys(req)
        if adapter is not None and adapter.vision and req.image_keys is not None:
            req.image_keys = [hashlib.sha256(f"{k}|lora:{adapter.digest}".encode()).hexdigest() for k in req.image_keys]
        if self.prefix is not None:
            fingerprint = self.m.info.fingerprint + (f"|lora:{adapter.digest}" if adapter is not None else "")
            return request_keys(req, self.m.family, fingerprint, self.prefix.block_size)
        return None

    def _cached(self, seq: Sequence) -> int:
        """Prompt positions of a waiting `seq` the prefix cache holds now; none for a request that asks for prompt
        logprobs (its positions are scored)."""
        return self.prefix.hit(seq.prefix_keys, seq.prompt_len) if seq.prompt_scores is None else 0

    async def generate(self, req: EngineRequest, flow: Flow | None = None) -> AsyncIterator[EngineOutput]:
        """Validates and queues `req`; yields one EngineOutput per step, or the outputs of several steps merged
        into one when the caller was not waiting (it fell behind). Raises SpliceError on bad input. `flow`: one whose
        reads its caller counts (`Flow(auto=False)`, acknowledged with `add_read`: a reader beyond the caller, over
        Multiplex); default: what the caller takes is read. A request whose reader falls --max-unread-tokens behind
        is paused until it reads (engine/flow.py)."""
        if self._thread is None:
            raise Unavailable("engine is not started")
        arrival = time.perf_counter()
        self.scheduler.check_choices(req.sampling.n)  # (read-only: no lock)
        adapter = await self.loras.adapter(req.lora)
        # with tensors, the finite checks read every tensor byte: off the event loop, like the forward
        inline = not req.tensors and req.prompt_len <= INLINE_VALIDATE_TOKENS
        keys = await inline_or_thread(inline, self._check, req, adapter)
        # a structured output's grammar compiles in its own thread (once per distinct spec): this request waits,
        # the running ones keep decoding
        grammar = await self._grammar_cache().get(req.sampling.structured) if req.sampling.structured else None
        seq = Sequence(req.request_id, req.prompt_len, req.sampling, self.m.info.max_model_len,
                       self.m.info.eos_token_ids, request=req, arrival=arrival, prefix_keys=keys,
                       grammar=grammar, adapter=adapter)
        if req.sampling.prompt_logprobs is not None:
            seq.prompt_scores = PromptScores(req.token_ids)
        seqs = fork.choices(seq, req)  # n > 1: the other choices start from its prefill (engine/fork.py)
        flow = flow if flow is not None else Flow()
        flow.limit = max(self.cfg.max_unread_tokens, flow.floor) if self.cfg.max_unread_tokens else 0
        flow.wake = self._wake.set
        for s in seqs:
            s.flow = flow
            s.listener = Listener(asyncio.get_running_loop(), self.cfg.stream_interval, flow)
        listeners = [s.listener for s in seqs]
        with self._lock:
            self.scheduler.add(seq)  # may raise ResourceExhausted / InvalidArgument
            self.requests[seq.seq_id] = seq
        self._wake.set()
        try:
            if len(seqs) > 1:
                async for out in fork.merged(listeners):
                    yield out
                return
            while True:
                out, error = await listeners[0].take()
                if out is not None:
                    yield out
                    if out.finished:
                        return
                if error is not None:
                    raise error
        finally:
            # the caller stopped listening (cancelled, closed the generator, or we are done)
            if any(not s.is_finished for s in seqs):
                for s in seqs:
                    s.abort_requested = True
                self._wake.set()
            with self._lock:
                for s in seqs:
                    s.listener = None

    def _grammar_cache(self) -> GrammarCache:
        if self._grammars is None:  # (its tokenizer is loaded by its compile thread, at the first compile)
            self._grammars = GrammarCache(functools.partial(AutoTokenizer.from_pretrained, self.cfg.model),
                                          self._logits_width or self.m.info.vocab_rows, self.m.info.eos_token_ids,
                                          self.cfg.structured_compile_timeout, self.cfg.structured_cache_mb << 20)
        return self._grammars

    async def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix block (vLLM's /reset_prefix_cache): requests that arrive after it returns
        prefill from scratch (running ones keep their rows). Done by the engine thread at its next step boundary;
        returns once it is. False when this engine has no prefix cache."""
        if self.prefix is None:
            return False
        if self._thread is None:  # (not started, or stopped: nothing else touches the cache)
            self.prefix.reset()
            return True
        await self._resets.wait(self._wake.set)
        return True

    def abort(self, request_id: str) -> int:
        """Aborts every live sequence with this request ID before its next step; returns how many."""
        with self._lock:
            hits = [s for s in self.requests.values() if s.request_id == request_id and not s.is_finished]
            for s in hits:
                s.abort_requested = True
        self._wake.set()
        return len(hits)

    # --- engine thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stopping:
            try:
                if not self.step():
                    self._wake.wait(self._paused.left())
                    self._wake.clear()
            except Exception:  # a bug in the loop itself: fail what is running, keep serving
                log.exception("engine step failed")
                self._fail_running(RuntimeError("engine step failed"))

    def step(self) -> bool:
        """One iteration: the scheduler's plan (every decoding row one position, this step's prompt parts) is executed
        by the runner, its logits sampled, the scheduler updated (tokens, ends, progress, n > 1 choices) and the
        outputs handed off; a prompt completed in it gives its first token in it. False when there was nothing to
        run."""
        out = self._schedule()
        if out.is_empty:
            return False
        self.steps += 1
        start = time.perf_counter()
        rows, parts = self._plan(out)
        try:
            loras = [s.adapter for s in rows] if self.loras.enabled else None
            ran = self.runner.execute([s.output_ids[-1] for s in rows], [p for _, p in parts], loras)
            if self._overlap:  # the forward runs on the device: the previous step's outputs go out meanwhile
                self._flush()
            self.m.family.synchronize()
        except Exception as exc:  # the decode failed: the shared cache may be half-updated, every running row fails
            log.exception("decode step failed")
            self._fail_running(exc)
            return True
        done = self._ran([s for s, _ in parts], ran)
        if ran.logits is not None:
            self._logits_width = ran.logits.shape[-1]
        step, tops = self.sampler.step(rows, done, ran.logits)
        with self._lock:
            ended = self.scheduler.update(out, step)
            self._hand_off(step, tops)
        self._release(ended)  # before the hand-off: a caller sending its next turn on reading the end finds its blocks
        if not self._overlap:  # (on a device, once the next forward is launched: above)
            self._flush()
        self._record(rows, [s for _, s in done], start)
        return True

    def _schedule(self) -> SchedulerOutput:
        """Drains aborts (their ends go out now, not after the forward) and schedules the next step."""
        if self._resets:
            self.prefix.reset()
            self.stats.prefix_cache(0, 0, 0)
            self._resets.answer()
        with self._lock:
            aborted = self.scheduler.drain_aborts()
        self._release(aborted)
        with self._lock:
            out = self.scheduler.schedule()
            self.stats.scheduled(len(self.scheduler.running), len(self.scheduler.waiting), len(out.paused))
        if out.paused or self._paused.flows:  # those paused too long are cancelled: their slots go to readers
            for seqs in self._paused.note(out.paused):
                self._fail(seqs, DeadlineExceeded(
                    f"request {seqs[0].request_id}: its reader fell {seqs[0].flow.limit} tokens behind "
                    f"(--max-unread-tokens) and read none of them for {self.cfg.unread_timeout:g} s (--unread-timeout);"
                    f" cancelled so that its slots go to readers that read"))
        if not self._overlap or out.is_empty:  # (else once the next forward is launched: `step`)
            self._flush()
        return out

    def _plan(self, out: SchedulerOutput) -> tuple[list[Sequence], list[tuple[Sequence, PromptPart]]]:
        """The runner's plan: the decoding rows in slot order (the first slots), and this step's prompt parts, each
        prompt merged (text, image features, supplied rows) at its first part; one whose vision/merge fails fails
        alone."""
        arrange(out.decode, self.scheduler.running, self.runner.swap)
        rows = list(out.decode)
        for seq in out.decode:
            rows[seq.slot] = seq
        parts = []
        for span in out.prefill:
            seq = span.seq
            if seq.prompt is None:
                try:
                    seq.prompt = self._prompt(seq)
                except Exception as exc:
                    log.exception("request %s: embedding failed", seq.request_id)
                    self._fail([seq], exc)
                    continue
                if seq.prefix_keys is not None:
                    self.stats.prefix_cache(seq.prompt_len, seq.cached, self.prefix.blocks)
            parts.append((seq, PromptPart(seq.prompt, span.start, span.end, seq.slot, len(seq.forks), seq.prefix_keys)))
        if (cache := self.family.encoder_cache) is not None and cache.queries:
            self.stats.encoder_cache(*cache.take_counts(), cache.bytes)
        return rows, parts

    def _prompt(self, seq: Sequence) -> Prompt:
        """`seq`'s merged prompt; a vision tower or connector its adapter adapts runs under it."""
        if self.m.family.lora is None:
            return self.family.prompt(seq.request)
        with self.m.family.lora.whole(seq.adapter):
            prompt = self.family.prompt(seq.request)
        prompt.adapter = seq.adapter
        return prompt

    def _ran(self, seqs: list[Sequence], ran: RunnerOutput) -> list[tuple[int, Sequence]]:
        """What the runner did to each prompt part goes on its record (its slot, its copies', its prompt logprobs); a
        part that failed fails its request. Returns the completed prompts that go on (with their logits row), their
        sampling state made and their other choices started beside them."""
        self.packed_steps += ran.packed
        for i, piece in ran.scores:
            seqs[i].prompt_scores.add(piece)
        for i, slot in ran.slots.items():
            seqs[i].slot = slot
            for child, copy in zip(seqs[i].forks, ran.copies.get(i, ()), strict=False):  # (none: copies failed)
                child.slot = copy
        for i, exc in ran.failed.items():
            log.error("request %s: prefill failed", seqs[i].request_id, exc_info=exc)
            self._fail([seqs[i]], exc)
        done = []
        for row, i in enumerate(ran.done):
            seq = seqs[i]
            if seq.is_finished:
                continue
            try:
                self.sampler.start([seq, *seq.forks], seq.request)
                if seq.prompt_scores is not None:
                    seq.prompt_scores.finish()
            except Exception as exc:
                self._fail([seq], exc)
                continue
            seq.request = seq.prompt = None  # the prompt's tensors are no longer needed
            with self._lock:
                for child in seq.forks:
                    self.requests[child.seq_id] = child
            done.append((row, seq))
        if ran.done and self.prefix is not None:  # completed prompts left their blocks: the gauge says so now
            self.stats.prefix_cache(0, 0, self.prefix.blocks)
        return done

    def _hand_off(self, step: StepOutput, tops: list[Top | None]) -> None:
        """Lock held. Every sampled row's output is collected for its caller (the ends with their usage, the first
        token with the prompt's logprobs); `_flush` hands them over."""
        for seq, tok, lp, top in zip(step.rows, step.tokens, step.logprobs, tops, strict=True):
            reason = seq.finish_reason
            scores = seq.prompt_scores if seq.num_generated == 1 else None
            self._emit(seq, EngineOutput((tok,), () if lp is None else (lp,), reason,
                                         Usage(seq.prompt_len, seq.num_generated) if reason is not None else None,
                                         *(top if top is not None else ((), ())),
                                         prompt_logprobs=scores.result if scores is not None else None,
                                         index=seq.index, cached_tokens=seq.cached if seq.num_generated == 1 else None))
        self.stats.generated(len(step.rows))  # one counter update per step, not per token

    def _record(self, rows: list[Sequence], done: list[Sequence], start: float) -> None:
        """The step's metrics: its decoded rows, and the prompts it completed (their time to first token)."""
        now = time.perf_counter()
        if rows:
            self.stats.decoded(len(rows), now - start)
        if done:
            ttfts = [now - s.arrival for s in done if s.num_generated]
            self.stats.prefilled(len(done), sum(s.prompt_len for s in done), now - start, ttfts)

    # --- outputs and the end of a sequence ---------------------------------------------------------

    def _emit(self, seq: Sequence, item: EngineOutput | BaseException) -> None:
        """Lock held. Collected; `_flush` hands it over with the rest of the step."""
        if seq.listener is not None:
            self._outbox.put(seq.listener, item)
            if seq.flow is not None and isinstance(item, EngineOutput):
                seq.flow.sent += len(item.token_ids)

    def _flush(self) -> None:
        """Lock not held. Sends what `_emit` collected: one call_soon_threadsafe per event loop."""
        with self._lock:
            by_loop = self._outbox.take()
        Outbox.send(by_loop)

    def _release(self, seqs: list[Sequence]) -> None:
        """Lock not held. The one place finished sequences leave: an error or an abort ends the stream with an
        exception; the record is forgotten and its sampling state goes; after a normal end (stop, length) its generated
        tokens' whole blocks go into the prefix cache (all but the last token, never fed: a multi-turn chat's next
        prompt re-sends them); then its row goes (the rows that move are told)."""
        with self._lock:
            gone = [s for s in seqs if self.requests.pop(s.seq_id, None) is not None]  # (counted once)
            for seq in gone:
                if seq.finish_reason is FinishReason.ERROR:
                    self._emit(seq, seq.error or RuntimeError(f"request {seq.request_id} failed"))
                elif seq.finish_reason is FinishReason.ABORT:
                    self._emit(seq, Cancelled(f"request {seq.request_id} was aborted"))
                self.stats.finished(seq.finish_reason.value if seq.finish_reason else "error")
        if not gone:
            return
        kept = False
        for seq in gone:
            self.sampler.release(seq)
            if seq.prefix_keys is not None and seq.slot is not None and seq.finish_reason in NORMAL_ENDS:
                self.runner.keep_generated(seq.slot, seq.prefix_keys, seq.output_ids[:-1])
                kept = True
        if kept:  # (a caller reading the end finds the gauge counting them)
            self.stats.prefix_cache(0, 0, self.prefix.blocks)
        slots = [s.slot for s in gone if s.slot is not None]
        if slots and self.runner.batch is not None:
            moved = self.runner.remove(slots)
            for seq in self.scheduler.running if moved else ():
                seq.slot = moved.get(seq.slot, seq.slot)
        for seq in gone:
            seq.slot = None
        if not self.scheduler.running and self.runner.batch is not None:
            self.runner.clear()  # nothing runs or is being prefilled: the buffers go with the batch
        heap.trim_soon(idle=self.runner.batch is None)  # what they held goes back to the OS, not only to malloc

    def _fail(self, seqs: list[Sequence], exc: BaseException) -> None:
        """Lock not held. Ends `seqs` with `exc` (a SpliceError keeps its status; others become INTERNAL)."""
        with self._lock:
            for seq in seqs:
                self.scheduler.finish(seq, FinishReason.ERROR, exc)
        self._release(seqs)
        self._flush()

    def _fail_running(self, exc: BaseException) -> None:
        with self._lock:
            seqs = list(self.scheduler.running)
        self._fail(seqs, exc)
        self.runner.clear()
