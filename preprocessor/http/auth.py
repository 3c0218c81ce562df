"""`--api-key` / SPLICE_API_KEY on the HTTP face: an ASGI middleware in front of every route, so that what the key
covers is everything but a short list of open paths, never a list of guarded ones (a route added later is covered
without anyone remembering to).

Open: `/health` (probes carry no key, as vLLM's) and `/version`, `/metrics` with `--open-metrics`, the API docs
(`/docs`, `/redoc`, `/openapi.json`) with `--open-docs`. Everything else, unknown paths included, needs
`Authorization: Bearer KEY`; without it a 401 before the body is read (and the connection closed when one was
sent, rather than drained).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from preprocessor.http.admission import has_body
from preprocessor.http.errors import error_response

ALWAYS_OPEN = ("/health", "/version")
UNAUTHENTICATED = "missing or wrong API key: send 'Authorization: Bearer KEY'"


class KeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, open_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = frozenset((*ALWAYS_OPEN, *open_paths))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        response = error_response(401, UNAUTHENTICATED)
        if has_body(scope):
            response.headers["connection"] = "close"
        await response(scope, receive, send)
