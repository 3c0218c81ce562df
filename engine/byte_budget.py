"""ByteBudget: a cap on the request tensor bytes the engine holds at once (a single event loop: no lock)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from splice.errors import ResourceExhausted


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def fits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.limit

    def refusal(self, nbytes: int) -> ResourceExhausted:
        return ResourceExhausted(f"request tensors of {nbytes} bytes do not fit: {self.used} of {self.limit} "
                                 f"bytes are held by other requests; retry later")

    @contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Reserves `nbytes` for the body of the with-block, or refuses at once when they do not fit."""
        if not self.fits(nbytes):
            raise self.refusal(nbytes)
        self.used += nbytes
        try:
            yield
        finally:
            self.used -= nbytes
