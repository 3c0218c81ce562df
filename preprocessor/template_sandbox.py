"""Request-supplied chat templates render in worker processes that are killed when they overrun.

A template is a program: `{% for i in range(99999) %}{% for j in range(99999) %}...` runs for hours, and a
thread cannot be stopped, so an in-process render would hold its thread (and the executor every other request
shares) for good. Here each render runs in a child process with a deadline; on expiry the caller gets
InvalidArgument at once and the child is killed. The child is niced and its address space capped, so a hostile
template neither starves the serving process of CPU for long nor exhausts its memory. It also gets no secrets:
its environment is a short allowlist (paths, locale), never the service's keys (SPLICE_API_KEY,
SPLICE_ENGINE_API_KEY) or anything else the operator exported. The model's own template is trusted and keeps
the in-process path (template.render).

Every render is answered within its budget, counted from its submission: a worker's start-up (a second or more
of imports on a busy machine) is never a render's time. `spares` processes wait already started, so a killed
worker is replaced at once while a keeper thread starts its successor; a render that no worker could take
before its deadline (all busy, or all being replaced) is refused then by its own caller (ResourceExhausted),
without waiting for a worker to start. Only the pool's very first start is not counted: a render submitted
before any worker was ever ready gets its budget from that moment.

Each working process has a driving thread taking jobs from one queue, so waiting for a free worker holds no
thread that other requests share.

Wire: 4-byte big-endian length + JSON, both ways, over the child's stdin/stdout.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from preprocessor.template import RenderJob, check_renders_tools, content_format
from splice.errors import InvalidArgument, ResourceExhausted, SpliceError, Unavailable, error_with_code

log = logging.getLogger(__name__)

WORKER_MEMORY_BYTES = 1 << 30  # address-space cap of a worker; real templates need a few MiB
WORKER_NICE = 10
WORKER_START_SECONDS = 60.0  # imports on a loaded machine
RESTART_BACKOFF = 1.0  # after a worker failed to start
# A render is not started with less of its budget left than this (nor than a tenth of the budget): it is refused
# as busy instead, since killing a worker for a good template that had no time left would cost a spare.
MIN_START_SECONDS = 0.1
MAX_PROMPT_CHARS = 16 << 20  # a rendered prompt longer than any context is the template's fault
_HEADER = struct.Struct(">I")
# Where `python -m preprocessor.template_sandbox` finds this package, however the parent was started.
_ROOT = str(Path(__file__).resolve().parent.parent)
# What a worker inherits (with LC_*): enough to run Python; anything else may be a secret.
_ENV_KEPT = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONHOME", "PYTHONNOUSERSITE",
                       "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUTF8"})


def worker_environment() -> dict[str, str]:
    """A worker's environment: this process's minus everything not in the allowlist, and a PYTHONPATH that
    finds this package."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEPT or k.startswith("LC_")}
    env["PYTHONPATH"] = os.pathsep.join([_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


class _Worker:
    """One child process; started here, ready once wait_ready() returns."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "preprocessor.template_sandbox"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=worker_environment())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self) -> None:
        """Returns once the child's imports are done (its ready frame); TimeoutError / EOFError if not."""
        self._receive(time.monotonic() + WORKER_START_SECONDS)

    def ask(self, job: RenderJob, deadline: float) -> dict[str, Any]:
        """The child's answer; TimeoutError once `deadline` (time.monotonic) passes, EOFError if it died."""
        body = json.dumps(job.__dict__).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(_HEADER.pack(len(body)) + body)
        self.proc.stdin.flush()
        return self._receive(deadline)

    def _receive(self, deadline: float) -> dict[str, Any]:
        header = self._read(_HEADER.size, deadline)
        return json.loads(self._read(_HEADER.unpack(header)[0], deadline))

    def _read(self, n: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, n - len(out))  # (a pipe closed by close() meanwhile: OSError / ValueError)
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


_STOP = object()


class TemplateSandbox:
    """Renders RenderJobs on `workers` child processes, `spares` more kept started to replace a killed one at
    once (all started now, in the background); each render is answered within `timeout` seconds of its
    submission."""

    def __init__(self, workers: int = 2, timeout: float = 2.0, spares: int = 1) -> None:
        if workers < 1 or spares < 0:
            raise ValueError(f"a template sandbox needs at least one worker and no negative spares, not "
                             f"{workers} / {spares}")
        self.timeout = timeout
        self._workers, self._spares = workers, spares
        self._size = workers + spares  # processes kept alive: driven, spare or starting
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._changed = threading.Condition()
        self._spare: collections.deque[_Worker] = collections.deque()  # ready, driven by no thread yet
        self._driving: set[_Worker] = set()
        self._starting: set[_Worker] = set()
        self._forking = 0  # processes the keeper is creating (outside the lock)
        self._closed = False
        self._first_ready: Future = Future()  # its result: when the first worker was ready (time.monotonic)
        self._threads = [threading.Thread(target=self._keep, name="template-sandbox-keeper", daemon=True)]
        self._threads += [threading.Thread(target=self._drive, name=f"template-sandbox-{i}", daemon=True)
                          for i in range(workers)]
        for t in self._threads:
            t.start()

    # ---- callers ----

    def render(self, job: RenderJob) -> str:
        """Blocking: from a thread (the sync normalize path, tests)."""
        future, submitted = self._submit(job)
        try:
            began = self._first_ready.result(WORKER_START_SECONDS)
        except TimeoutError:
            future.cancel()
            raise Unavailable("the chat template workers did not start") from None
        try:
            return future.result(self._left(submitted, began))
        except TimeoutError:
            if future.cancel():  # no worker took it in time: refused now, not once one is free or restarted
                raise self._busy() from None
            return future.result()  # a worker has it: answered by its deadline

    async def render_async(self, job: RenderJob) -> str:
        """From the event loop: waiting for a worker holds no thread."""
        future, submitted = self._submit(job)
        try:
            if self._first_ready.done():
                began = self._first_ready.result()
            else:  # only while the pool first starts
                try:
                    began = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._first_ready)),
                                                   WORKER_START_SECONDS)
                except TimeoutError:
                    raise Unavailable("the chat template workers did not start") from None
            answer = asyncio.wrap_future(future)
            done, _ = await asyncio.wait({answer}, timeout=self._left(submitted, began))
            if not done and future.cancel():
                raise self._busy()
            return await answer
        except BaseException:
            future.cancel()  # an abandoned (or refused) request's queued render never runs
            raise

    def _submit(self, job: RenderJob) -> tuple[Future, float]:
        future: Future = Future()
        submitted = time.monotonic()
        if self._closed:
            future.set_exception(Unavailable("the chat template workers are shut down"))
        else:
            self._jobs.put((job, submitted, future))
        return future, submitted

    def _left(self, submitted: float, began: float) -> float:
        return max(0.0, self._deadline(submitted, began) - time.monotonic())

    def _deadline(self, submitted: float, began: float) -> float:
        """A render's deadline: its budget from its submission, or from the pool's first start if later."""
        return max(submitted, began) + self.timeout

    def _busy(self) -> ResourceExhausted:
        return ResourceExhausted(f"every chat template worker stayed busy for {self.timeout:g} s "
                                 f"(--chat-template-timeout); try again")

    # ---- the pool ----

    def _drive(self) -> None:
        """One working process at a time: takes a spare, renders jobs on it until it overruns or dies."""
        worker: _Worker | None = None
        while True:
            if worker is None:
                worker = self._take_spare()
                if worker is None:
                    return
            item = self._jobs.get()
            if item is _STOP:
                return
            job, submitted, future = item
            if not future.set_running_or_notify_cancel():
                continue  # refused at its deadline by its caller, or abandoned
            deadline = self._deadline(submitted, self._first_ready.result())
            if deadline - time.monotonic() < min(MIN_START_SECONDS, self.timeout / 10):
                future.set_exception(self._busy())
                continue
            try:
                future.set_result(self._answer(worker.ask(job, deadline)))
            except SpliceError as exc:
                future.set_exception(exc)
            except (TimeoutError, EOFError, OSError, ValueError) as exc:
                if self._closed:
                    why: SpliceError = Unavailable("the chat template workers are shut down")
                elif isinstance(exc, TimeoutError):
                    why = InvalidArgument(f"the chat template did not render within {self.timeout:g} s "
                                          f"(--chat-template-timeout)")
                else:
                    why = InvalidArgument("the chat template's render process died (out of memory?)")
                future.set_exception(why)  # answered first; the kill and the replacement follow
                self._retire(worker)
                worker = None

    def _take_spare(self) -> _Worker | None:
        with self._changed:
            while not self._spare and not self._closed:
                self._changed.wait()
            if self._closed:
                return None
            worker = self._spare.popleft()
            self._driving.add(worker)
            self._changed.notify_all()  # wait_warm
            return worker

    def _retire(self, worker: _Worker) -> None:
        with self._changed:
            self._driving.discard(worker)
            self._changed.notify_all()  # the keeper starts a successor
        worker.kill()

    def _keep(self) -> None:
        """Keeps `workers + spares` processes alive: starts (together) as many as are missing."""
        while True:
            with self._changed:
                while not self._closed and self._count() >= self._size:
                    self._changed.wait()
                if self._closed:
                    return
                missing = self._size - self._count()
                self._forking = missing
            fresh, failed = [], False
            try:
                for _ in range(missing):
                    fresh.append(_Worker())
            except OSError as exc:
                log.error("a chat template worker did not start: %s", exc)
                failed = True
            with self._changed:
                self._forking = 0
                self._starting.update(fresh)
                if self._closed:  # close() did not see them
                    self._starting.clear()
                    for worker in fresh:
                        worker.kill()
                    return
            for worker in fresh:
                try:
                    worker.wait_ready()
                except (TimeoutError, EOFError, OSError, ValueError) as exc:
                    if not self._closed:
                        log.error("a chat template worker did not start: %s", type(exc).__name__)
                    failed = True
                    ready = False
                else:
                    ready = True
                with self._changed:
                    self._starting.discard(worker)
                    if ready and not self._closed:
                        self._spare.append(worker)
                        if not self._first_ready.done():
                            self._first_ready.set_result(time.monotonic())
                        self._changed.notify_all()
                        continue
                worker.kill()
            if failed:
                time.sleep(RESTART_BACKOFF)  # a child that cannot start must not be respawned in a tight loop

    def _count(self) -> int:
        return len(self._spare) + len(self._driving) + len(self._starting) + self._forking

    @staticmethod
    def _answer(answer: dict[str, Any]) -> str:
        if "prompt" in answer:
            return answer["prompt"]
        raise error_with_code(answer["code"], answer["message"])

    def processes(self) -> dict[str, list[int]]:
        """Pids of the worker processes by state: "driving" (each rendering for a driving thread), "spare"
        (started, waiting to replace one), "starting"."""
        with self._changed:
            return {"driving": sorted(w.pid for w in self._driving), "spare": [w.pid for w in self._spare],
                    "starting": sorted(w.pid for w in self._starting)}

    def wait_warm(self, timeout: float) -> bool:
        """Waits until every process is started and ready (each worker driven, the spares waiting); False if not
        within `timeout` seconds."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._closed or (len(self._driving) == self._workers and len(self._spare) == self._spares),
                timeout) and not self._closed

    def close(self) -> None:
        """Kills every worker; queued and running renders fail, later ones are refused."""
        with self._changed:
            self._closed = True
            workers = [*self._spare, *self._driving, *self._starting]
            self._spare.clear()
            self._driving.clear()
            self._changed.notify_all()
        if not self._first_ready.done():
            self._first_ready.set_exception(Unavailable("the chat template workers are shut down"))
        for _ in self._threads:
            self._jobs.put(_STOP)
        for w in workers:
            w.kill()
        while True:  # whatever was queued behind the stops
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and item[2].set_running_or_notify_cancel():
                item[2].set_exception(Unavailable("the chat template workers are shut down"))


# ---- the child -------------------------------------------------------------------------------------------


def _answer(job: dict[str, Any]) -> dict[str, Any]:
    import jinja2
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        check_renders_tools(job["template"], job["variables"])
        fmt = content_format(job["template"])
        messages = job["messages"].get(fmt)
        if isinstance(messages, str):  # the conversation cannot take this format: the reason
            return {"code": "FAILED_PRECONDITION", "message": messages}
        rendered, _ = render_jinja_template(conversations=[messages], chat_template=job["template"],
                                            add_generation_prompt=job["add_generation_prompt"],
                                            continue_final_message=job["continue_final_message"],
                                            **job["variables"])
    except SpliceError as exc:
        return {"code": exc.code, "message": exc.message}
    except (jinja2.TemplateError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        return {"code": "INVALID_ARGUMENT", "message": f"chat template failed: {type(exc).__name__}: {exc}"}
    if not isinstance(rendered[0], str):
        return {"code": "INVALID_ARGUMENT", "message": "chat template did not render to text"}
    if len(rendered[0]) > MAX_PROMPT_CHARS:
        return {"code": "INVALID_ARGUMENT", "message": f"the chat template rendered {len(rendered[0])} characters; "
                                                       f"at most {MAX_PROMPT_CHARS}"}
    return {"prompt": rendered[0]}


def _serve() -> None:
    import resource

    os.nice(WORKER_NICE)
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt the replies
    # Imports and a first render paid before the ready frame, not inside a render's budget: a spare is warm.
    warm = [{"role": "user", "content": "x"}]
    _answer({"template": "{{ messages[0]['content'] }}", "messages": {"string": warm, "openai": warm},
             "add_generation_prompt": False, "continue_final_message": False, "variables": {}})

    ready = json.dumps({"ready": True}).encode()
    replies.write(_HEADER.pack(len(ready)) + ready)
    replies.flush()
    while header := requests.read(_HEADER.size):
        job = json.loads(requests.read(_HEADER.unpack(header)[0]))
        body = json.dumps(_answer(job)).encode()
        replies.write(_HEADER.pack(len(body)) + body)
        replies.flush()


if __name__ == "__main__":
    _serve()
