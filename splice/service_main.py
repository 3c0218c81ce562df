"""The entry point both services share: logging set up one way, start-up errors as one line."""

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


def run_service(name: str, serve: Awaitable[None], log_level: str) -> int:
    """Runs `serve` to completion; a SpliceError (wrong --model, busy port) is printed, not a traceback."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr, format=LOG_FORMAT)
    try:
        asyncio.run(serve)
    except SpliceError as exc:
        print(f"splice {name}: {exc.message}", file=sys.stderr)
        return 2
    return 0
