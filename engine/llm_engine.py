"""The engine: schedule -> run -> sample -> emit, on a dedicated thread; an asyncio API on top.

    engine = LLMEngine(EngineConfig(model=folder)); engine.start(); await engine.warmup()
    async for out in engine.generate(request): ...      # EngineOutput per step (merged if the reader lags)
    engine.abort(request_id)                            # or just stop iterating / cancel the task

Torch runs only on the engine thread, so the event loop (health checks, cancellations, new requests)
never waits for a forward. Aborts are drained at every step boundary, before the next forward. A step's
outputs reach each event loop in one hand-off (engine/outbox.py), not one per token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator

import torch

from engine import fork
from engine.config import EngineConfig
from engine.grammar_masks import GrammarMasks
from engine.loader import LoadedModel, load
from engine.logits_controls import LogitsControls
from engine.metrics import EngineStats, NoStats
from engine.model_runner import ModelRunner, PromptPart, Stepped, batch_capacity
from engine.outbox import Listener, Outbox
from engine.prefix_cache import PrefixCache, PrefixKeys, cache_root, prefix_keys
from engine.sampler import make_generator, sample
from engine.scheduler import Scheduler, SchedulerOutput, mixed_prefill_default
from engine.sequence import Sequence
from engine.tensor_parallel import Ranks
from engine.validate import validate_request
from splice.engine_output import EngineOutput, FinishReason, Usage
from splice.engine_request import IMAGE_EMBEDS, EngineRequest
from splice.errors import SpliceError, Unavailable
from splice.grammar import GrammarCache
from splice.model_info import ModelInfo
from splice.offload import inline_or_thread
from splice.prompt_logprobs import PromptLogprobs
from splice.sampling import SamplingParams

# A request without tensors and up to this many tokens is validated on the event loop: checking its IDs takes
# less time (~60 ns per ID) than a thread's hand-off (splice/offload.py).
INLINE_VALIDATE_TOKENS = 4096

log = logging.getLogger(__name__)
DEFAULT_BATCH_TOKENS = 8192


class Cancelled(SpliceError):
    """The sequence was aborted through `LLMEngine.abort` while its caller still listened."""

    code = "CANCELLED"


class LLMEngine:
    def __init__(self, cfg: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.cfg = cfg
        # Tensor parallelism: the other ranks start and join first, then every rank loads its shard.
        self.ranks = Ranks(cfg.tensor_parallel_size, cfg) if cfg.tensor_parallel_size > 1 else None
        self.m = loaded if loaded is not None else load(cfg)
        self.prefix = self._prefix_cache(cfg)
        self.runner = ModelRunner(self.m.family, batch_capacity(cfg.max_running_seqs, self.m.info.max_model_len),
                                  self.prefix)
        self.family = self.m.family  # its prompt() is a model call: the runner's and its run on every rank
        if self.ranks is not None:
            self.runner, self.family = self.ranks.wrap(self.runner, self.family, self.m.device)
        budget = cfg.max_batch_tokens or max(DEFAULT_BATCH_TOKENS, self.m.info.max_model_len, cfg.max_running_seqs)
        mixed = cfg.mixed_prefill_tokens or mixed_prefill_default(self.m.device.type == "cuda"
                                                                  or cfg.simulate_forward_ms is not None)
        self.scheduler = Scheduler(cfg.max_running_seqs, budget, cfg.max_queue, mixed,
                                   self.family.packs_mixed_steps, self._cached if self.prefix is not None else None)
        # reset_prefix_cache calls waiting for the engine thread (each loop and the future it resolves)
        self._resets: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._lock = threading.Lock()  # guards the scheduler and the sequence tables
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._seqs: dict[int, Sequence] = {}  # seq_id -> live sequence
        self._listeners: dict[int, Listener] = {}  # seq_id -> where its outputs go
        # The forward runs on a device (a GPU, or simulated): a launch returns at once and the host waits only when it
        # samples, so a step's outputs are handed over after the next forward's launch, while it runs, instead of
        # taking the GIL and the cores from the host work that prepares it. On CPU the forward is that host work: no
        # step waits for the next one's forward to hand its outputs over.
        self._overlap = self.m.device.type == "cuda" or cfg.simulate_forward_ms is not None
        self._outbox = Outbox()  # this step's outputs, handed to the event loops once per step
        self._generators: dict[int, torch.Generator] = {}  # seq_id -> its private sampling generator
        self._forked: dict[int, list[Sequence]] = {}  # this step's n > 1 prompts: seq_id -> its choices that started
        self._controls = LogitsControls(self.m.device)  # penalties and masks: per-sequence state, batched apply
        self._masks = GrammarMasks()  # structured outputs: matchers of the constrained sequences, batched mask
        self._grammars: GrammarCache | None = None  # compiled structured outputs; made at the first one
        self._logits_width: int | None = None  # the logits' vocabulary (grammars are compiled for it)
        self.steps = 0  # forwards run; tests and metrics read it
        self.packed_steps = 0  # of those, mixed steps run as one packed forward
        self.stats: EngineStats = EngineStats()  # Prometheus recording, per step or per request

    @property
    def info(self) -> ModelInfo:
        return self.m.info

    def _prefix_cache(self, cfg: EngineConfig) -> PrefixCache | None:
        """The prefix cache, where it is on and can serve this model; one log line says why not otherwise."""
        family = self.m.family
        if not cfg.enable_prefix_caching or not cfg.prefix_cache_mb:
            return None
        if cfg.tensor_parallel_size > 1:
            log.info("prefix caching is off: not implemented for tensor parallelism (--tensor-parallel-size %d)",
                     cfg.tensor_parallel_size)
            return None
        if not family.cache.chunkable:
            log.info("prefix caching is off for the %s family: its recurrent layers' state is not kept at block "
                     "boundaries (the encoder cache still applies)", family.name)
            return None
        log.info("prefix caching on: blocks of %d positions within %d MiB", cfg.block_size, cfg.prefix_cache_mb)
        if cfg.simulate_forward_ms is not None:
            log.info("prefix caching under --simulate-forward-ms: keys are made, but a simulated forward writes no "
                     "key/value columns, so no block is kept and no prompt hits")
        return PrefixCache(cfg.block_size, cfg.prefix_cache_mb << 20)

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
        self._answer_resets()  # (asked for as it stopped: nothing is cached any more that matters)
        if self._grammars is not None:
            self._grammars.close()
            self._grammars = None
        if self.ranks is not None:
            self.ranks.stop()
            self.ranks = None
        with self._lock:
            for seq in list(self._seqs.values()):
                self.scheduler.finish(seq, FinishReason.ERROR, Unavailable("engine stopped"))
                self._release(seq)
        self._flush()

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

    def _check(self, req: EngineRequest) -> None:
        """Validation, then the encoder cache's content keys (hashing every pixel byte, like the finite checks
        beside it, not on the engine loop)."""
        validate_request(req, self.m.info, self.m.family.images)
        req.image_keys = self.m.family.image_keys(req)
        if self.prefix is not None:
            req.prefix_keys = self._prefix_keys(req)

    def _prefix_keys(self, req: EngineRequest) -> PrefixKeys:
        """The prefix cache's content keys of `req`'s whole blocks (engine/prefix_cache.py)."""
        f, size = self.m.family, self.prefix.block_size
        inputs = req.model_inputs
        pieces = f.image_pieces(inputs) if inputs and IMAGE_EMBEDS not in inputs else []
        rows = [f.images.expected_rows(p) for p in pieces]
        root = cache_root(self.m.info.fingerprint, size, req.sampling.cache_salt)
        return prefix_keys(req, size, root, f.image_token_id, pieces, rows, req.image_keys, f.images_both_ways)

    def _cached(self, seq: Sequence) -> int:
        """Prompt positions of a waiting `seq` the prefix cache holds now, whole blocks, its last position never (its
        logits are needed); none for a request that asks for prompt logprobs (its positions are scored)."""
        keys = seq.payload.prefix_keys if seq.payload is not None else None
        if keys is None or seq.sampling.prompt_logprobs is not None:
            return 0
        size = self.prefix.block_size
        return self.prefix.match(keys, (seq.prompt_len - 1) // size) * size

    async def generate(self, req: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Validates and queues `req`; yields one EngineOutput per step, or the outputs of several steps merged
        into one when the caller was not waiting (it fell behind). Raises SpliceError on bad input."""
        if self._thread is None:
            raise Unavailable("engine is not started")
        arrival = time.perf_counter()
        self.scheduler.check_choices(req.sampling.n)  # (read-only: no lock)
        # with tensors, the finite checks read every tensor byte: off the event loop, like the forward
        inline = not req.tensors and req.prompt_len <= INLINE_VALIDATE_TOKENS
        await inline_or_thread(inline, self._check, req)
        # a structured output's grammar compiles in its own thread (once per distinct spec): this request waits,
        # the running ones keep decoding
        grammar = await self._grammar_cache().get(req.sampling.structured) if req.sampling.structured else None
        seq = Sequence(req.request_id, req.prompt_len, req.sampling, self.m.info.max_model_len,
                       self.m.info.eos_token_ids, payload=req, grammar=grammar)
        seqs = fork.choices(seq, req)  # n > 1: the other choices start from its prefill (engine/fork.py)
        listeners = [Listener(asyncio.get_running_loop(), arrival, self.cfg.stream_interval) for _ in seqs]
        with self._lock:
            self.scheduler.add(seq)  # may raise ResourceExhausted / InvalidArgument
            self._seqs[seq.seq_id] = seq
            for s, listener in zip(seqs, listeners, strict=True):
                self._listeners[s.seq_id] = listener
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
                    self._listeners.pop(s.seq_id, None)

    def _grammar_cache(self) -> GrammarCache:
        if self._grammars is None:
            def tokenizer():
                from transformers import AutoTokenizer
                return AutoTokenizer.from_pretrained(self.cfg.model)
            self._grammars = GrammarCache(tokenizer, self._logits_width or self.m.info.vocab_rows,
                                          self.m.info.eos_token_ids, self.cfg.structured_compile_timeout)
        return self._grammars

    def _answer_resets(self) -> None:
        """Lock not held. Ends the reset_prefix_cache calls waiting so far (each on its own event loop)."""
        with self._lock:
            resets, self._resets = self._resets, []
        for loop, done in resets:
            loop.call_soon_threadsafe(lambda f=done: f.done() or f.set_result(None))

    async def reset_prefix_cache(self) -> bool:
        """Forgets every cached prefix block (vLLM's /reset_prefix_cache): requests that arrive after it returns
        prefill from scratch (running ones keep their rows). Done by the engine thread at its next step boundary;
        returns once it is. False when this engine has no prefix cache."""
        if self.prefix is None:
            return False
        if self._thread is None:  # (not started, or stopped: nothing else touches the cache)
            self.prefix.reset()
            return True
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._lock:
            self._resets.append((loop, done))
        self._wake.set()
        await done
        return True

    def abort(self, request_id: str) -> int:
        """Aborts every live sequence with this request ID before its next step; returns how many."""
        with self._lock:
            hits = [s for s in self._seqs.values() if s.request_id == request_id and not s.is_finished]
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
                    self._wake.wait()
                    self._wake.clear()
            except Exception:  # a bug in the loop itself: fail what is running, keep serving
                log.exception("engine step failed")
                self._fail_running(RuntimeError("engine step failed"))

    def step(self) -> bool:
        """One iteration: every running row decodes and this step's prompt parts are prefilled (ModelRunner.step); a
        prompt completed in it gives its first token in it. False when there was nothing to run."""
        out, rows, arrivals = self._schedule()
        if out.is_empty:
            return False
        self.steps += 1
        start = time.perf_counter()
        parts = self._prompt_parts(out)
        try:
            ran = self.runner.step([s.output_ids[-1] for s in rows], list(parts.values()))
            if self._overlap:  # the forward runs on the device: the previous step's outputs go out meanwhile
                self._flush()
            self.m.family.synchronize()
        except Exception as exc:  # the decode failed: the shared cache may be half-updated, every running row fails
            log.exception("decode step failed")
            self._fail_running(exc)
            return True
        done = self._prefilled(out, parts, ran)
        if self.prefix is not None and ran.joined:  # completed prompts left their blocks: the gauge says so now
            self.stats.prefix_cache(0, 0, self.prefix.blocks)
        if ran.logits is not None:  # one sampling and one hand-off: the rows' tokens and the first tokens of prompts
            self._postprocess(rows + done, ran.logits)
        self._record(rows, done, arrivals, start)
        return True

    def _schedule(self) -> tuple[SchedulerOutput, list[Sequence], dict[int, float]]:
        """Drains aborts (their ends go out now, not after the forward) and schedules the next step -> (it, the rows
        that decode in it, in the runner's order, and the arrival time of each prompt in it, read now: a sequence that
        finishes in its prefill may lose its listener before the step ends)."""
        if self._resets:
            self.prefix.reset()
            self.stats.prefix_cache(0, 0, 0)
            self._answer_resets()
        with self._lock:
            aborted = self.scheduler.drain_aborts()
            for seq in [s for s in self._seqs.values() if s.is_finished]:
                self._release(seq)  # the aborted ones, running or waiting
            out = self.scheduler.schedule()
            self.stats.scheduled(len(self.scheduler.running), len(self.scheduler.waiting))
            arrivals = {c.seq.seq_id: lst.arrival for c in out.parts if (lst := self._listeners.get(c.seq.seq_id))}
        if not self._overlap or out.is_empty:  # (else once the next forward is launched: `step`)
            self._flush()
        self.runner.remove({s.seq_id for s in aborted})
        with self._lock:
            rows = [self._seqs[i] for i in self.runner.seq_ids]
        return out, rows, arrivals

    def _prompt_parts(self, out: SchedulerOutput) -> dict[int, PromptPart]:
        """This step's prompt parts, merged (text, image features, supplied rows) at a prompt's first part; one whose
        vision/merge fails fails alone."""
        parts: dict[int, PromptPart] = {}
        for chunk in out.parts:
            seq = chunk.seq
            if seq.is_finished:
                continue
            try:
                prompt = self.family.prompt(seq.payload) if chunk.start == seq.cached else None
            except Exception as exc:
                log.exception("request %s: embedding failed", seq.request_id)
                self._fail([seq], exc)
                continue
            if prompt is not None and (keys := seq.payload.prefix_keys) is not None:
                prompt.prefix_keys = keys
                self.stats.prefix_cache(seq.prompt_len, seq.cached, self.prefix.blocks)
            parts[seq.seq_id] = PromptPart(seq.seq_id, prompt, chunk.start, chunk.end)
        if (cache := self.family.encoder_cache) is not None and cache.queries:
            self.stats.encoder_cache(*cache.take_counts(), cache.bytes)
        return parts

    def _prefilled(self, out: SchedulerOutput, parts: dict[int, PromptPart], ran: Stepped) -> list[Sequence]:
        """Records how far each prompt got (Sequence.prefilled) and fails those whose prefill failed; returns the
        sequences whose prompt is complete, in `ran.joined` order, started (sampling state, other choices)."""
        self.packed_steps += ran.packed
        seqs = {c.seq.seq_id: c.seq for c in out.parts}
        joined = set(ran.joined)
        with self._lock:
            for seq_id, part in parts.items():
                if seq_id not in ran.failed:
                    self.scheduler.chunk_done(seqs[seq_id], seqs[seq_id].prompt_len if seq_id in joined else part.end)
        for seq_id, exc in ran.failed.items():
            log.error("request %s: prefill failed", seqs[seq_id].request_id, exc_info=exc)
            self._fail([seqs[seq_id]], exc)
        done = [seqs[i] for i in ran.joined]
        for seq in done:
            self._started(seq)
        return done

    def _record(self, rows: list[Sequence], done: list[Sequence], arrivals: dict[int, float], start: float) -> None:
        """The step's metrics: its decoded rows, and the prompts it completed (their time to first token)."""
        now = time.perf_counter()
        if rows:
            self.stats.decoded(len(rows), now - start)
        if done:
            prefilled = [s for s in done if s.finish_reason is not FinishReason.ERROR]  # aborted ones ran too
            ttfts = [now - arrivals[s.seq_id] for s in done if s.seq_id in arrivals and s.num_generated]
            self.stats.prefilled(len(done), sum(s.prompt_len for s in prefilled), now - start, ttfts)

    def _started(self, seq: Sequence) -> None:
        """`seq`'s prompt is in: its sampling state is made, its prompt tensors are dropped."""
        self._generators[seq.seq_id] = make_generator(seq.sampling.seed, self.m.device)
        req: EngineRequest = seq.payload
        if seq.sampling.repetition_penalty != 1.0 and req.embed_spans:  # supplied rows are no tokens
            covered = {p for s in req.embed_spans for p in range(s.offset, s.offset + s.length)}
            prompt_ids = [t for i, t in enumerate(req.token_ids) if i not in covered]
        else:
            prompt_ids = req.token_ids
        seq.cache_keys = req.prefix_keys  # its generated blocks are kept as it ends
        self._controls.start(seq, prompt_ids)  # (engine thread only, as are its apply, record and release)
        if seq.grammar is not None:
            self._masks.start(seq, seq.grammar)
        if seq.forks:
            self._fork(seq, prompt_ids)
        seq.payload = None  # prompt tensors are no longer needed

    def _fork(self, seq: Sequence, prompt_ids: list[int]) -> None:
        """`seq`'s prompt is in: its other choices start from a copy of its row, each with its own generator and
        controls, and take their first token from its prefill's logits in `_postprocess` (engine/fork.py)."""
        with self._lock:
            if seq.abort_requested:  # no choice of it will be read: they never start (its end frees their slots)
                return
            children = self.scheduler.fork(seq)
            for child in children:
                self._seqs[child.seq_id] = child
        try:
            self.runner.fork(seq.seq_id, [c.seq_id for c in children])
        except Exception as exc:  # (growing the key/value buffers): the request fails whole, the batch goes on
            log.exception("request %s: starting its %d other choices failed", seq.request_id, len(children))
            with self._lock:  # released (their error sent) at the next step; this step's sampling skips them
                for s in (seq, *children):
                    self.scheduler.finish(s, FinishReason.ERROR, exc)
            return
        for child in children:
            self._generators[child.seq_id] = make_generator(child.sampling.seed, self.m.device)
            self._controls.start(child, prompt_ids)
            if seq.grammar is not None:  # each choice follows the grammar with its own matcher
                self._masks.start(child, seq.grammar)
        self._forked[seq.seq_id] = children

    def _postprocess(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        self._logits_width = logits.shape[-1]
        if self._forked:  # choices that start in this step sample their first token from their prompt's logits
            seqs, logits = fork.expand(seqs, logits, self._forked)
            self._forked = {}
        # the grammars' masks first (vLLM's order): the penalties and the logprobs see the masked distribution
        logits = self._masks.apply(logits, seqs)  # `logits` itself when no row has a grammar
        controlled = self._controls.apply(logits, seqs)  # [rows, vocab]; `logits` itself when no row has a control
        tokens, logprobs, tops = sample(controlled, [s.sampling for s in seqs],
                                        [self._generators[s.seq_id] for s in seqs], raw=logits)
        self._controls.record(seqs, tokens)
        complete = self._masks.advance(seqs, tokens)  # grammars that reached their end: those outputs stop
        finished: set[int] = set()
        skipped = 0
        with self._lock:
            for seq, tok, lp, top in zip(seqs, tokens, logprobs, tops, strict=True):
                if seq.is_finished:  # aborted while this step ran: nothing more goes out
                    finished.add(seq.seq_id)
                    skipped += 1
                    continue
                reason = seq.append(tok, lp)
                if reason is None and seq.seq_id in complete:
                    reason = FinishReason.STOP
                if reason is not None:
                    self.scheduler.finish(seq, reason)
                    finished.add(seq.seq_id)
                usage = Usage(seq.prompt_len, seq.num_generated) if reason is not None else None
                self._emit(seq, EngineOutput((tok,), () if lp is None else (lp,), reason, usage,
                                             *(top if top is not None else ((), ())),
                                             prompt_logprobs=self._prompt_logprobs(seq), index=seq.index,
                                             cached_tokens=seq.cached if seq.num_generated == 1 else None))
                if reason is not None:
                    self._release(seq)
        # before the hand-off: a caller who sends its next turn on reading this one's end finds its blocks
        self._keep_generated([s for s in seqs if s.seq_id in finished])
        # one hand-off per event loop for the whole step: now, or on a device once the next forward is launched (`step`)
        if not self._overlap:
            self._flush()
        self.stats.generated(len(seqs) - skipped)  # one counter update per step, not per token
        self.runner.remove(finished)

    def _keep_generated(self, ended: list[Sequence]) -> None:
        """The generated tokens of sequences that ended normally go into the prefix cache (all but the last: its
        keys were never computed), for a multi-turn chat's next prompt, which re-sends them."""
        if self.prefix is None:
            return
        for seq in ended:
            keys = seq.cache_keys
            if keys is not None and seq.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
                more = keys.extend(seq.output_ids[:-1], self.prefix.block_size)
                self.runner.keep_generated(seq.seq_id, more, len(keys.keys))
        if ended:  # (before the hand-off: a caller reading the end finds the gauge counting its blocks)
            self.stats.prefix_cache(0, 0, self.prefix.blocks)

    # --- bookkeeping (callers hold the lock unless noted) -----------------------------------------

    def _prompt_logprobs(self, seq: Sequence) -> PromptLogprobs | None:
        """A sequence's prompt logprobs (engine/prompt_logprobs.py) go out with its first token."""
        if seq.sampling.prompt_logprobs is None or seq.num_generated != 1:
            return None
        return self.runner.take_prompt_logprobs(seq.seq_id)

    def _emit(self, seq: Sequence, item: EngineOutput | BaseException) -> None:
        """Collected; `_flush` hands it over with the rest of the step."""
        listener = self._listeners.get(seq.seq_id)
        if listener is not None:
            self._outbox.put(listener, item)

    def _flush(self) -> None:
        """Lock not held. Sends what `_emit` collected: one call_soon_threadsafe per event loop."""
        with self._lock:
            by_loop = self._outbox.take()
        Outbox.send(by_loop)

    def _release(self, seq: Sequence) -> None:
        """`seq` has finished: end its stream (an error or an abort ends it with an exception), forget it."""
        if seq.finish_reason is FinishReason.ERROR:
            self._emit(seq, seq.error or RuntimeError(f"request {seq.request_id} failed"))
        elif seq.finish_reason is FinishReason.ABORT:
            self._emit(seq, Cancelled(f"request {seq.request_id} was aborted"))
        if self._seqs.pop(seq.seq_id, None) is not None:  # counted once, however it ended
            self.stats.finished(seq.finish_reason.value if seq.finish_reason else "error")
        self._generators.pop(seq.seq_id, None)
        self._controls.release(seq.seq_id)
        self._masks.release(seq.seq_id)

    def _fail(self, seqs: list[Sequence], exc: BaseException) -> None:
        """Lock not held. Ends `seqs` with `exc` (a SpliceError keeps its status; others become INTERNAL)."""
        with self._lock:
            for seq in seqs:
                self.scheduler.finish(seq, FinishReason.ERROR, exc)
                self._release(seq)
        self._flush()
        self.runner.remove({s.seq_id for s in seqs})

    def _fail_running(self, exc: BaseException) -> None:
        with self._lock:
            seqs = list(self.scheduler.running)
        self._fail(seqs, exc)
        self.runner.clear()
