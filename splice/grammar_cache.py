"""The engine's compiled grammars: compiled off the event loop by a few worker threads, fairly across requests, and
kept within a byte budget.

- Kept: compiled grammars by the spec's hash, least recently used evicted first, their xgrammar-reported sizes within
  `max_bytes` (--structured-cache-mb). A grammar whose compiled size alone passes the budget is refused, naming its
  size and the flag (it would hold more memory than every other grammar together may). xgrammar's own compiler cache
  is off: it has no bound by default and would keep every grammar ever compiled.
- Fair: `workers` threads take compiles from one queue, cheapest first as their spec's length estimates it, each
  job's place aged by its wait (a job queued `len(spec) / AGING_CHARS_PER_S` seconds ago goes ahead of any new one),
  so a user's few large grammars cannot hold a small schema behind them, and large ones still start. Concurrent
  requests for one spec share its compile.
- Budgets: a request's compile gets `timeout_s` counted from its own start (the compile's, or the request's arrival
  when it joins one already running), never from its wait in the queue, which is other requests' time; past it the
  request is refused, the message naming the compile's own time. xgrammar cannot stop a compile: one past its budget
  runs on to the end (and is kept), but no longer holds a worker's place: another thread takes the queue meanwhile
  (at most `workers` such overtime compiles at once). A request that leaves while queued takes its job with it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import xgrammar as xgr

from splice.errors import InvalidArgument
from splice.grammar import build, spec_key
from splice.sampling import DEFAULT_STRUCTURED_CACHE_MB, DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S
from splice.structured_output import StructuredOutput

COMPILE_WORKERS = 2
# How fast a queued job's place improves while it waits, in spec characters per second: a 64 KiB grammar queued 33 s
# ago goes ahead of a new 1-character spec. (A large spec compiles in seconds to minutes; a schema in milliseconds.)
AGING_CHARS_PER_S = 2000.0
FAILURES_KEPT = 256  # recent refusals of a spec (invalid, too large), remembered so it is not compiled again


def _untraced(exc: InvalidArgument) -> InvalidArgument:
    """A refusal to keep or hand on: a copy without a traceback. A raised one's traceback holds the frames it passed,
    the compile's among them with the grammar that was too large (hundreds of MB), and each raise of it adds the
    raiser's frames: kept with the refusals, that memory never went."""
    return InvalidArgument(exc.message, exc.param)


@dataclass(eq=False)
class _Job:
    key: str
    work: Callable[[], Any]
    due: float  # queue order: submitted + cost in seconds (aged SJF)
    done: Future = field(default_factory=Future)  # the compiled grammar, or the refusal
    began: Future = field(default_factory=Future)  # set (to its start time) when a worker takes it
    started: float | None = None
    late: bool = False  # a waiter's budget ran out while it compiled: it no longer holds a worker's place
    waiters: int = 0
    dropped: bool = False  # nobody waits for it any more: a worker skips it


class GrammarCache:
    """Compiled grammars for one tokenizer. `tokenizer` loads the HF tokenizer, in a compile thread at the first
    compile."""

    def __init__(self, tokenizer: Callable[[], Any], vocab_size: int, stop_token_ids: tuple[int, ...] = (),
                 timeout_s: float = DEFAULT_STRUCTURED_COMPILE_TIMEOUT_S,
                 max_bytes: int = DEFAULT_STRUCTURED_CACHE_MB << 20, workers: int = COMPILE_WORKERS) -> None:
        self._tokenizer, self._vocab_size, self._stops = tokenizer, vocab_size, list(stop_token_ids) or None
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.workers = workers
        self.bytes = 0  # held by the kept grammars
        self._compiler: xgr.GrammarCompiler | None = None
        self._compiler_lock = threading.Lock()
        self._kept: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._failed: OrderedDict[str, InvalidArgument] = OrderedDict()
        self._jobs: dict[str, _Job] = {}  # queued or compiling, by key
        self._queue: list[tuple[float, int, _Job]] = []
        self._order = itertools.count()
        self._running: set[_Job] = set()
        self._threads = 0
        self._idle = 0
        self._closed = False
        self._lock = threading.Condition()

    # --- compiling ----------------------------------------------------------------------------------

    def _compiler_for(self) -> xgr.GrammarCompiler:
        with self._compiler_lock:  # (made once, by the first compile: it reads the whole vocabulary)
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(self._tokenizer(), vocab_size=self._vocab_size,
                                                          stop_token_ids=self._stops)
                self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler

    def _compile(self, so: StructuredOutput) -> xgr.CompiledGrammar:
        compiled = build(so, self._compiler_for())
        size = compiled.memory_size_bytes
        if size > self.max_bytes:
            raise InvalidArgument(f"structured output {so.kind} compiles to {size / (1 << 20):.1f} MiB of token masks, "
                                  f"more than the {self.max_bytes / (1 << 20):g} MiB the engine keeps for compiled "
                                  f"grammars (--structured-cache-mb); simplify it")
        return compiled

    def _keep(self, key: str, compiled: xgr.CompiledGrammar) -> None:
        """Lock held."""
        if key in self._kept:
            return
        self._kept[key] = compiled
        self.bytes += compiled.memory_size_bytes
        while self.bytes > self.max_bytes and len(self._kept) > 1:
            _, old = self._kept.popitem(last=False)
            self.bytes -= old.memory_size_bytes

    def _remember_failure(self, key: str, exc: InvalidArgument) -> None:
        """Lock held."""
        self._failed[key] = _untraced(exc)  # (its own: the waiters raise `exc`, adding their frames to it)
        while len(self._failed) > FAILURES_KEPT:
            self._failed.popitem(last=False)

    # --- the queue and its workers --------------------------------------------------------------

    def _submit(self, key: str, cost_chars: int, work: Callable[[], Any]) -> _Job:
        """Lock held. A new job for `key` (none is pending), queued; a worker is started if none is idle and fewer
        than the workers (plus the compiles past their budget) run."""
        job = _Job(key, work, time.monotonic() + cost_chars / AGING_CHARS_PER_S)
        self._jobs[key] = job
        heapq.heappush(self._queue, (job.due, next(self._order), job))
        self._lock.notify()
        self._grow()
        return job

    def _overtime(self) -> int:
        """Lock held. Compiles running past their budget (each holds a thread, not a worker's place), capped."""
        now = time.monotonic()
        late = sum(1 for j in self._running if j.late or (j.started is not None and now - j.started > self.timeout_s))
        return min(late, self.workers)

    def _grow(self) -> None:
        """Lock held. Starts a worker when more jobs wait than workers idle, and there is room."""
        if len(self._queue) > self._idle and self._threads < self.workers + self._overtime() and not self._closed:
            self._threads += 1
            threading.Thread(target=self._work, name="splice-grammar", daemon=True).start()

    def _take(self) -> _Job | None:
        """Lock held. The next job to run, or None when this thread should end (closed, or more threads than the
        workers and the overtime compiles need)."""
        while True:
            if self._closed or self._threads > self.workers + self._overtime():
                return None
            while self._queue and self._queue[0][2].dropped:
                heapq.heappop(self._queue)
            if self._queue:
                return heapq.heappop(self._queue)[2]
            self._idle += 1
            self._lock.wait()
            self._idle -= 1

    def _work(self) -> None:
        while True:
            with self._lock:
                job = self._take()
                if job is None:
                    self._threads -= 1
                    return
                job.started = time.monotonic()
                self._running.add(job)
            job.began.set_result(job.started)
            try:
                result, error = job.work(), None
            except InvalidArgument as exc:
                result, error = None, _untraced(exc)
            except BaseException as exc:  # (a bug goes to the waiters as it is)
                result, error = None, exc
            with self._lock:
                self._running.discard(job)
                self._jobs.pop(job.key, None)
                if error is None and isinstance(result, xgr.CompiledGrammar):
                    self._keep(job.key, result)
                elif isinstance(error, InvalidArgument):
                    self._remember_failure(job.key, error)
                self._grow()
            if error is None:
                job.done.set_result(result)
            else:
                job.done.set_exception(error)

    # --- the async API ----------------------------------------------------------------------------

    def _job(self, key: str, cost_chars: int, work: Callable[[], Any]) -> _Job | xgr.CompiledGrammar:
        with self._lock:
            if (kept := self._kept.get(key)) is not None:
                self._kept.move_to_end(key)
                return kept
            if (failed := self._failed.get(key)) is not None:
                raise _untraced(failed)
            job = self._jobs.get(key)
            if job is None or job.dropped:
                job = self._submit(key, cost_chars, work)
            job.waiters += 1
            return job

    def _leave(self, job: _Job) -> None:
        with self._lock:
            job.waiters -= 1
            if job.waiters == 0 and job.started is None:  # queued, and nobody waits for it: never compiled
                job.dropped = True
                self._jobs.pop(job.key, None)
            self._grow()  # (a compile that passed its budget frees a worker's place for the queue)

    async def get(self, so: StructuredOutput) -> xgr.CompiledGrammar:
        """The compiled grammar of `so`; the caller's event loop keeps running meanwhile."""
        return await self._wait(spec_key(so), len(so.spec), lambda: self._compile(so), so.kind)

    async def _wait(self, key: str, cost_chars: int, work: Callable[[], Any], kind: str) -> Any:
        arrival = time.monotonic()
        job = self._job(key, cost_chars, work)
        if not isinstance(job, _Job):
            return job
        try:
            started = await asyncio.shield(asyncio.wrap_future(job.began))  # (the queue: its wait is others' time)
            left = self.timeout_s - (time.monotonic() - max(started, arrival))
            try:
                return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.done)), max(left, 0.0))
            except TimeoutError:
                job.late = True
                raise InvalidArgument(f"structured output {kind} took longer than {self.timeout_s:g} s to compile "
                                      f"(--structured-compile-timeout); simplify it") from None
        finally:
            self._leave(job)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for _, _, job in self._queue:
                if not job.began.done():
                    job.began.cancel()
            self._queue.clear()
            self._lock.notify_all()
