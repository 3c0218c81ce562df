"""Request-supplied chat templates render in worker processes that are killed when they overrun.

A template is a program: `{% for i in range(99999) %}{% for j in range(99999) %}...` runs for hours, and a
thread cannot be stopped, so an in-process render would hold its thread (and the executor every other request
shares) for good. Here each render runs in a child process with a deadline; on expiry the child is killed and
replaced, and the caller gets InvalidArgument. The child is niced and its address space capped, so a hostile
template neither starves the serving process of CPU for long nor exhausts its memory. The model's own template
is trusted and keeps the in-process path (template.render).

Each worker process has a driving thread taking jobs from one queue, so waiting for a free worker holds no
thread that other requests share; a job whose deadline passed while it queued is refused without running
(ResourceExhausted). A render's deadline counts from its submission; a worker's start-up is not counted.

Wire: 4-byte big-endian length + JSON, both ways, over the child's stdin/stdout.
"""

from __future__ import annotations

import asyncio
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

from preprocessor.template import RenderJob, content_format
from splice.errors import InvalidArgument, ResourceExhausted, SpliceError, Unavailable, error_with_code

log = logging.getLogger(__name__)

WORKER_MEMORY_BYTES = 1 << 30  # address-space cap of a worker; real templates need a few MiB
WORKER_NICE = 10
WORKER_START_SECONDS = 60.0  # imports on a loaded machine
MAX_PROMPT_CHARS = 16 << 20  # a rendered prompt longer than any context is the template's fault
_HEADER = struct.Struct(">I")
# Where `python -m preprocessor.template_sandbox` finds this package, however the parent was started.
_ROOT = str(Path(__file__).resolve().parent.parent)


class _Worker:
    """One child process, driven by one pool thread."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", "preprocessor.template_sandbox"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        # Its imports take a second or more on a busy machine: not part of any render's budget.
        self._receive(time.monotonic() + WORKER_START_SECONDS)
        self.ready_at = time.monotonic()

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
            chunk = os.read(fd, n - len(out))
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
    """Renders RenderJobs on `workers` child processes (started now, in the background), each render within
    `timeout` seconds of its submission."""

    def __init__(self, workers: int = 2, timeout: float = 2.0) -> None:
        self.timeout = timeout
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live: set[_Worker] = set()
        self._closed = False
        self._threads = [threading.Thread(target=self._drive, name=f"template-sandbox-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def render(self, job: RenderJob) -> str:
        """Blocking: from a thread (the sync normalize path, tests)."""
        return self._submit(job).result()

    async def render_async(self, job: RenderJob) -> str:
        """From the event loop: waiting for a worker holds no thread."""
        return await asyncio.wrap_future(self._submit(job))

    def _submit(self, job: RenderJob) -> Future:
        future: Future = Future()
        if self._closed:
            future.set_exception(Unavailable("the chat template workers are shut down"))
        else:
            self._jobs.put((job, time.monotonic() + self.timeout, future))
        return future

    def _drive(self) -> None:
        worker: _Worker | None = None
        while True:
            if worker is None:
                worker = self._start()
                if worker is None:
                    return
            item = self._jobs.get()
            if item is _STOP:
                return
            job, deadline, future = item
            if not future.set_running_or_notify_cancel():
                continue
            deadline = max(deadline, worker.ready_at + self.timeout)  # a worker's start-up is not the job's time
            if time.monotonic() >= deadline:
                future.set_exception(ResourceExhausted(
                    f"every chat template worker stayed busy for {self.timeout:g} s (--chat-template-timeout); "
                    f"try again"))
                continue
            try:
                future.set_result(self._answer(worker.ask(job, deadline)))
            except SpliceError as exc:
                future.set_exception(exc)
            except (TimeoutError, EOFError, OSError) as exc:
                self._retire(worker)
                worker = None
                why = (f"the chat template did not render within {self.timeout:g} s (--chat-template-timeout)"
                       if isinstance(exc, TimeoutError) else "the chat template's render process died (out of memory?)")
                future.set_exception(InvalidArgument(why))

    @staticmethod
    def _answer(answer: dict[str, Any]) -> str:
        if "prompt" in answer:
            return answer["prompt"]
        raise error_with_code(answer["code"], answer["message"])

    def _start(self) -> _Worker | None:
        """A fresh worker, or None once closed (or when the child cannot start: logged, retried later)."""
        while not self._closed:
            try:
                worker = _Worker()
            except (TimeoutError, EOFError, OSError) as exc:
                log.error("a chat template worker did not start: %s", type(exc).__name__)
                time.sleep(1.0)
                continue
            with self._lock:
                if not self._closed:
                    self._live.add(worker)
                    return worker
            worker.kill()
        return None

    def _retire(self, worker: _Worker) -> None:
        with self._lock:
            self._live.discard(worker)
        worker.kill()

    def close(self) -> None:
        """Kills every worker; queued and running renders fail, later ones are refused."""
        with self._lock:
            self._closed = True
            workers, self._live = list(self._live), set()
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
    import jinja2  # noqa: F401  (imports paid before the ready frame, not inside a render's budget)
    import transformers.utils.chat_template_utils  # noqa: F401

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
