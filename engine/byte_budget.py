"""ByteBudget: a cap on the request tensor bytes the engine holds at once (a single event loop: no lock).

A call holds the bytes it has received, taken chunk by chunk before each is written, and gives them back when
it ends: memory is committed as the bytes are written, and a stream that only declared a size holds nothing.
"""

from __future__ import annotations

from splice.errors import ResourceExhausted


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, nbytes: int) -> bool:
        """Holds `nbytes` more if they fit now; False (nothing taken) if not."""
        if self.used + nbytes > self.limit:
            return False
        self.used += nbytes
        return True

    def give(self, nbytes: int) -> None:
        self.used -= nbytes

    def refusal(self, nbytes: int) -> ResourceExhausted:
        return ResourceExhausted(f"request tensors of {nbytes} bytes do not fit: {self.used} of {self.limit} "
                                 f"bytes are held by other requests; retry later")
