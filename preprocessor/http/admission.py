"""The HTTP face's side of admission control (preprocessor/admission.py): an ASGI middleware that admits each API
request before its body is read, and counts the body's bytes as they arrive.

- A body is charged PARSE_FACTOR x its bytes: reading and parsing it holds that much (the received chunks, their
  join, the parsed strings), and VALUE_BYTES more per `,` and `:` in it, counted as each chunk arrives: every one
  separates a value that parsing makes an object (a logit_bias entry of 14 bytes becomes ~110 bytes of key, float and
  slot), so a body of millions of small values is charged what parsing it would hold before it is parsed. The
  charge, not the bytes sent, is what the cap bounds.
- A body whose charge passes the byte cap (--max-inflight-request-bytes) is a 413 on any route, unknown ones too:
  by its Content-Length before a byte is read, or (chunked, no Content-Length) at the chunk that passes it.
- An API request holds a place and its charge until its response is sent: by Content-Length at once, or chunk by
  chunk as they arrive; a charge that does not fit beside other requests' is a 429 (retry later).
- A body that stays silent for `idle` seconds while it is read (--upload-idle-timeout) is a 408: a client that
  trickles a body (slow POST) cannot hold its place, or a connection, for longer.
- A response sent before the request's body was read to its end closes the connection: uvicorn would otherwise
  read and drop the rest (however large) to reuse the connection, for a route that never wanted it.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preprocessor.admission import Admission
from preprocessor.http.errors import SpliceHTTPError, error_response
from splice.errors import ResourceExhausted

ADMITTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
# Measured on a chat body of one long string: 128 MiB sent chunked peaks at +385 MiB of RSS (+259 MiB with a
# Content-Length) while it is read and parsed, before any of it is refused as too long.
PARSE_FACTOR = 3
# Bytes a parsed JSON value holds beyond its text, charged per separator (measured with tracemalloc: a dict entry of
# str key and float ~55 per separator, a list item 9-58 by its kind).
VALUE_BYTES = 48
CLOSE = (b"connection", b"close")


class BodyTooLarge(SpliceHTTPError):
    def __init__(self, cap: int, values: int = 0) -> None:
        if values:
            detail = (f"the request body holds more than {values} JSON values: parsing them would hold more than the "
                      f"{cap} bytes the preprocessor holds for requests at once (--max-inflight-request-bytes; "
                      f"{PARSE_FACTOR}x the body's bytes and {VALUE_BYTES} per value)")
        else:
            detail = (f"the request body is larger than {cap // PARSE_FACTOR} bytes: reading and parsing it would hold "
                      f"{PARSE_FACTOR}x that, more than the {cap} bytes the preprocessor holds for requests at once "
                      f"(--max-inflight-request-bytes)")
        super().__init__(413, detail)


class BodyTimeout(SpliceHTTPError):
    def __init__(self, idle: float, received: int) -> None:
        super().__init__(408, f"the request body sent nothing for {idle:g} s after {received} bytes; it is abandoned "
                              f"(--upload-idle-timeout)")


class NoRoom(SpliceHTTPError):
    """ResourceExhausted while a body arrives, as an HTTPException: FastAPI passes those on from its body reading
    (any other exception there becomes a 400 "error parsing the body")."""

    def __init__(self, exc: ResourceExhausted) -> None:
        super().__init__(429, exc.message)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value)  # h11 refused the request already unless it is one decimal number
    return None


def has_body(scope: Scope) -> bool:
    """The request sends a body: a Content-Length above 0, or a chunked one (h11 allows nothing else)."""
    length = _content_length(scope)
    if length is not None:
        return length > 0
    return any(name == b"transfer-encoding" for name, _ in scope["headers"])


class _CountedBody:
    """`receive` and `send` of one request: the body's bytes counted (against the cap, and into the ticket when
    they were not admitted by Content-Length), and the connection closed by a response that leaves some unread."""

    def __init__(self, receive: Receive, send: Send, cap: int, unread: bool, idle: float | None) -> None:
        self._receive, self._send = receive, send
        self.cap, self.idle = cap, idle
        self.unread = unread  # more body to come
        self.received = 0
        self.values = 0  # separators seen: the values parsing will make
        self.ticket = None  # an API request's: grows by each chunk's values (and bytes, when chunked)
        self.by_length = False  # its bytes were charged from Content-Length

    async def receive(self) -> Message:
        if not self.unread or self.idle is None:  # (after the body: the disconnect, whenever it comes)
            message = await self._receive()
        else:
            try:
                message = await asyncio.wait_for(self._receive(), self.idle)
            except TimeoutError:
                raise BodyTimeout(self.idle, self.received) from None
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            n = len(chunk)
            values = chunk.count(b",") + chunk.count(b":")
            self.received += n
            self.values += values
            self.unread = self.unread and message.get("more_body", False)
            if self.received * PARSE_FACTOR > self.cap:
                raise BodyTooLarge(self.cap)
            if self.received * PARSE_FACTOR + self.values * VALUE_BYTES > self.cap:
                raise BodyTooLarge(self.cap, self.values)
            charge = (0 if self.by_length else n * PARSE_FACTOR) + values * VALUE_BYTES
            if self.ticket is not None and charge:
                try:
                    self.ticket.grow(charge)
                except ResourceExhausted as exc:
                    raise NoRoom(exc) from None
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self.unread:
            message = {**message, "headers": [*message.get("headers", ()), CLOSE]}
        await self._send(message)


class AdmissionMiddleware:
    def __init__(self, app: ASGIApp, admission: Admission, idle: float | None = None) -> None:
        """`idle`: seconds a body may stay silent while it is read (None: no limit)."""
        self.app = app
        self.admission = admission
        self.idle = idle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        cap = self.admission.max_bytes
        body = _CountedBody(receive, send, cap, has_body(scope), self.idle)
        ticket = None
        try:
            if length is not None and length * PARSE_FACTOR > cap:
                raise BodyTooLarge(cap)
            if scope["path"].startswith(ADMITTED_PREFIXES):
                ticket = self.admission.enter((length or 0) * PARSE_FACTOR)
        except BodyTooLarge as exc:
            await error_response(413, exc.detail)(scope, receive, body.send)
            return
        except ResourceExhausted as exc:
            await error_response(429, exc.message)(scope, receive, body.send)
            return
        if ticket is not None:
            body.ticket, body.by_length = ticket, length is not None
        try:
            await self.app(scope, body.receive, body.send)
        finally:
            if ticket is not None:
                ticket.release()
