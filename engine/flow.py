"""A request's reading flow: how far its reader is behind what the engine sent it, so that a reader that stops reading
stops costing steps and memory (issue 40, row 9).

The engine counts the tokens it hands to a request's streams (`sent`, on the engine thread); the request's reader
counts what it has taken (`read`, on its event loop). A request whose reader is `behind` by --max-unread-tokens is
paused: the scheduler leaves its sequences out of the decode (they keep their slots and key/value columns, and
generate nothing) until the reader takes what is waiting, which wakes the engine. One paused longer than
--unread-timeout is cancelled (DEADLINE_EXCEEDED): its slots go to readers that read.

Who reads depends on the hop: a caller of `LLMEngine.generate` in the engine's process reads what it takes from the
stream (`auto`: a GenerateWhole / Generate call's writer, which gRPC's flow control holds back while its client does
not read); over a Multiplex stream, whose many calls share one HTTP/2 window, the preprocessor acknowledges what its
own consumer took (`MultiplexRequest.read`) and the engine's call counts that instead. So every hop holds at most
about --max-unread-tokens of a request's output: the engine's listeners, the Multiplex writer, the preprocessor's
inbox; the HTTP face writes as its client reads (uvicorn waits while the socket's buffers are full).

vLLM, SGLang and TGI never pause: their streams' queues grow while the engine generates until the client
disconnects (vLLM aborts on disconnect), so a client that holds its connection open without reading costs
the whole answer's steps and memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(eq=False)
class Flow:
    """One request's (all of its choices share it). `sent` and `paused_since` are the engine thread's, `read` the
    reader's event loop's: each field has one writer."""

    auto: bool = True  # the engine's stream counts what its caller takes; False: the caller acknowledges (`add_read`)
    # the least `limit` its acknowledgements need: a reader that acknowledges every K tokens is always up to K behind
    floor: int = 0
    limit: int = 0  # tokens the reader may be behind before the request pauses; 0: never pauses
    wake: Callable[[], None] = lambda: None  # wakes the engine thread (thread-safe)
    sent: int = 0  # tokens handed to the request's streams
    read: int = 0  # of those, tokens its reader has taken
    paused_since: float | None = None  # when the engine first found it behind (time.monotonic()); None: not paused

    @property
    def behind(self) -> bool:
        return 0 < self.limit <= self.sent - self.read

    def add_read(self, tokens: int) -> None:
        """On the reader's loop: `tokens` more were taken. The engine is woken when that ends a pause."""
        was = self.behind
        self.read += tokens
        if was and not self.behind:
            self.wake()

