"""The entry point both services share: logging set up one way, start-up errors as one line, and the event loop.

The loop is uvloop's where it is installed (Linux, macOS): every hand-off on a request's way (a gRPC completion,
a thread's result, the engine thread's outputs) wakes the loop, and uvloop's wake-ups and callbacks cost less,
which is most of the time the two hops add before the first token. Plain asyncio otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

from splice import heap
from splice.errors import SpliceError

# --model value (a built-in name, folder or HF id) -> a local HF folder. The layer above the services
# supplies it (app.models.resolve_model), so a service never imports the tiny-model builder.
Resolve = Callable[[str], str]
# A quick look at a --model value (app.models.check_model): SpliceError for one that cannot be a model, before a
# service imports its libraries or resolves it
CheckModel = Callable[[str], None]


def model_refused(name: str, model: str | None, check: CheckModel | None) -> bool:
    """Whether `check` refuses `model`, said in one line as a service's start-up errors are."""
    if model is None or check is None:
        return False
    try:
        check(model)
    except SpliceError as exc:
        print(f"splice {name}: {exc.message}", file=sys.stderr)
        return True
    return False
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's new_event_loop when uvloop is installed, else None (asyncio's own loop)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


_frozen = False


def freeze_startup_heap() -> None:
    """Moves every object alive now into the collector's permanent generation; call it once a service is loaded.

    A loaded service holds hundreds of thousands of long-lived objects (torch, transformers, the tokenizer's
    tables, protobuf descriptors). Each full collection walks all of them, and requests allocate enough to
    trigger one every few dozen calls: the walk then lands inside some request's time to first token (about
    0.2 ms per call on average, measured on the engine's Generate path). Frozen objects are never walked and
    never freed, which is what start-up objects are meant for anyway; garbage is collected first so none of it
    is frozen. Objects made later (per-request ones) are collected as before."""
    global _frozen
    if _frozen:  # (the preprocessor reports SERVING again after each engine reconnect: one full walk is enough)
        return
    gc.collect()
    gc.freeze()
    heap.collect_when_idle()
    _frozen = True


def run_service(name: str, serve: Awaitable[None], log_level: str) -> NoReturn:
    """Runs `serve` to completion, then ends the process (exit_service); a SpliceError (wrong --model, busy port)
    is printed, not a traceback, and so is a Ctrl-C before the service's own handlers are set (while it loads)."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr, format=LOG_FORMAT)
    factory = loop_factory()
    logging.getLogger(__name__).info("%s: event loop %s", name, "uvloop" if factory else "asyncio")
    code = 0
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve)
    except SpliceError as exc:
        print(f"splice {name}: {exc.message}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"splice {name}: interrupted", file=sys.stderr)
        code = 130
    exit_service(code)


def exit_service(code: int) -> NoReturn:
    """Ends a service that has stopped (its servers drained, its workers ended) without the interpreter's teardown:
    there, native modules torch imports report every object still alive as leaked (triton's, where triton is
    installed: dozens of nanobind "leaked function" lines after a clean stop). Logs and output are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
