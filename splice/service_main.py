"""The entry point both services share: logging set up one way, start-up errors as one line, and the event loop.

The loop is uvloop's where it is installed (Linux, macOS): every hand-off on a request's way (a gRPC completion,
a thread's result, the engine thread's outputs) wakes the loop, and uvloop's wake-ups and callbacks cost less,
which is most of the time the two hops add before the first token. Plain asyncio otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable

from splice.errors import SpliceError

# --model value (a tiny name, folder or cached HF id) -> a local HF folder. The layer above the services
# supplies it (app.models.resolve_model), so a service never imports the tiny-model builder.
Resolve = Callable[[str], str]
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's new_event_loop when uvloop is installed, else None (asyncio's own loop)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_service(name: str, serve: Awaitable[None], log_level: str) -> int:
    """Runs `serve` to completion; a SpliceError (wrong --model, busy port) is printed, not a traceback."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr, format=LOG_FORMAT)
    factory = loop_factory()
    logging.getLogger(__name__).info("%s: event loop %s", name, "uvloop" if factory else "asyncio")
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve)
    except SpliceError as exc:
        print(f"splice {name}: {exc.message}", file=sys.stderr)
        return 2
    return 0
