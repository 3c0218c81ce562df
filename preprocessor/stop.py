"""Stop strings on streamed text: a possible partial match is held back, the matched string is dropped (or kept, with
include_stop_str_in_output), and text after it is never released.

As vLLM's detokenizer: text pushed as not `searchable` (that of the first min_tokens tokens) can begin a match but
cannot hold a whole one; a match must end in text pushed after it.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str], include: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include = include  # the matched stop string ends the released text
        self._pending = ""  # text not yet released; never longer than the longest stop string - 1 between calls
        self._floor = 0  # a match must end past this index of _pending (text before it was not searchable)
        self.matched: str | None = None  # the stop string that ended the output

    @property
    def active(self) -> bool:
        """There are stop strings to look for."""
        return bool(self._stops)

    def push(self, text: str, searchable: bool = True) -> str:
        """Text safe to release after appending `text`; once a stop string matched, everything is dropped."""
        if self.matched is not None:
            return ""
        if not self._stops:
            return text
        self._pending += text
        if not searchable:
            self._floor = len(self._pending)
        else:
            first = None
            for stop in self._stops:
                at = self._pending.find(stop, max(0, self._floor - len(stop) + 1))
                if at != -1 and (first is None or at < first[0]):
                    first = (at, stop)
            if first is not None:
                self.matched = first[1]
                end = first[0] + (len(first[1]) if self._include else 0)
                out, self._pending = self._pending[:end], ""
                return out
        hold = self._hold_length()
        out = self._pending[:len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold:]
        self._floor = max(0, self._floor - len(out))
        return out

    def _hold_length(self) -> int:
        """Length of the longest suffix of the pending text that begins some stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """Held-back text at the end of generation (it never completed a stop string)."""
        out, self._pending = ("" if self.matched is not None else self._pending), ""
        return out
