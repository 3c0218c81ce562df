"""Admission control: how many requests the preprocessor works on at once, and how many request bytes it
holds for them, across both faces. Past either cap a request is refused with RESOURCE_EXHAUSTED at once,
before its payload is parsed (gRPC: the size is known from the raw message; HTTP: from Content-Length before the
body is read, or chunk by chunk as a chunked body arrives: http/admission.py), instead of the process growing until
it stalls or is killed.

A request holds its place and its bytes until its answer is complete: the parsed payload lives that long.
gRPC calls are admitted by splice/call_guard.py, by their raw message size before it is parsed. State changes
hold a lock, so that any thread may admit and release.

What a request decodes can be far larger than what it sent (a few KB of PNG are 50 MB of pixels), so the
decoders `charge` what they are about to allocate to the request's ticket, known from headers and shapes:
the ticket that admitted the request is this context's (asyncio tasks and to_thread carry it along).
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from dataclasses import dataclass

from splice import heap
from splice.errors import ResourceExhausted

MiB = 1 << 20


class Admission:
    def __init__(self, max_concurrent: int = 256, max_bytes: int = 1024 * MiB) -> None:
        if max_concurrent < 1 or max_bytes < 1:
            raise ValueError(f"admission caps must be >= 1, got {max_concurrent} requests, {max_bytes} bytes")
        self.max_concurrent, self.max_bytes = max_concurrent, max_bytes
        self.running = 0
        self.held = 0
        self._lock = threading.Lock()

    def enter(self, nbytes: int) -> Ticket:
        """A place for one request of `nbytes`; ResourceExhausted when it does not fit now."""
        with self._lock:
            self._check_place()
            self._check_bytes(nbytes)
            self.running += 1
            self.held += nbytes
        return _current(Ticket(self, nbytes))

    def stream(self, declared: int) -> Ticket:
        """A ticket for a client stream (Upload) that will bring `declared` bytes: it holds nothing yet. The
        stream holds its bytes as they arrive (`Ticket.grow`) and its place once it is complete
        (`Ticket.place`), like a unary request once its message has arrived: a silent stream holds neither,
        so it cannot keep others out for free. ResourceExhausted when `declared` could never fit."""
        if declared > self.max_bytes:
            raise ResourceExhausted(f"a request of {declared} bytes is larger than the {self.max_bytes} request "
                                    f"bytes the preprocessor holds at once (--max-inflight-request-bytes)")
        return _current(Ticket(self, 0, placed=False))

    def full(self) -> bool:
        return self.running >= self.max_concurrent

    def _check_place(self) -> None:
        if self.running >= self.max_concurrent:
            raise ResourceExhausted(f"the preprocessor is working on {self.running} requests, its limit "
                                    f"(--max-concurrent-requests); retry later")

    def _check_bytes(self, nbytes: int) -> None:
        if self.held + nbytes > self.max_bytes:
            raise ResourceExhausted(f"a request of {nbytes} bytes does not fit: {self.held} of {self.max_bytes} "
                                    f"request bytes are held (--max-inflight-request-bytes); retry later")


@dataclass
class Ticket:
    admission: Admission
    nbytes: int
    placed: bool = True  # holds one of the --max-concurrent-requests places
    released: bool = False

    def grow(self, nbytes: int, what: str = "") -> None:
        """`nbytes` more for this request (`what`: for what, as the refusal says); ResourceExhausted when they do
        not fit now, or never can: the request would hold more than the cap by itself."""
        a = self.admission
        if self.released:  # (its request is over: holding bytes now would hold them for ever)
            return
        if what and self.nbytes + nbytes > a.max_bytes:
            raise ResourceExhausted(f"{what} takes about {nbytes} bytes; with the {self.nbytes} the request holds "
                                    f"already that is more than the {a.max_bytes} request bytes the preprocessor "
                                    f"holds at once (--max-inflight-request-bytes)")
        with a._lock:
            if self.released:
                return
            if what and a.held + nbytes > a.max_bytes:
                raise ResourceExhausted(f"{what} takes about {nbytes} bytes, which do not fit: {a.held} of "
                                        f"{a.max_bytes} request bytes are held (--max-inflight-request-bytes); "
                                        f"retry later")
            a._check_bytes(nbytes)
            a.held += nbytes
            self.nbytes += nbytes

    def place(self) -> None:
        """This request's place among the concurrent ones; ResourceExhausted when there is none now."""
        a = self.admission
        with a._lock:
            if not self.placed:
                a._check_place()
                a.running += 1
                self.placed = True

    def release(self) -> None:
        with self.admission._lock:
            if not self.released:
                self.released = True
                self.admission.running -= 1 if self.placed else 0
                self.admission.held -= self.nbytes
        if _CURRENT.get() is self:  # (tasks and threads started from here on charge nothing to it)
            _CURRENT.set(None)
        heap.trim_soon(idle=self.admission.running == 0)  # what it held goes back to the OS, not only to the allocator


_CURRENT: ContextVar[Ticket | None] = ContextVar("splice_admission_ticket", default=None)


def _current(ticket: Ticket) -> Ticket:
    _CURRENT.set(ticket)
    return ticket


def charge(nbytes: int, what: str) -> None:
    """`nbytes` more held by the request this context serves, for `what` it is about to decode or allocate;
    ResourceExhausted when they do not fit. Outside an admitted request (a core used directly) it does nothing."""
    ticket = _CURRENT.get()
    if ticket is not None and nbytes > 0:
        ticket.grow(nbytes, what)
