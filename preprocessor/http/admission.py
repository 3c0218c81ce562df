"""The HTTP face's side of admission control (preprocessor/admission.py): an ASGI middleware that admits each
API request by its Content-Length before the body is read, and holds its place until the response is sent.
A body without Content-Length (chunked) is admitted by count only; uvicorn still bounds nothing for it, so
deployments behind a proxy should let the proxy require the header."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from preprocessor.admission import Admission
from preprocessor.http.errors import splice_error_body
from splice.errors import ResourceExhausted

ADMITTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


class AdmissionMiddleware:
    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(ADMITTED_PREFIXES):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        try:
            ticket = self.admission.enter(int(length) if length.isdigit() else 0)
        except ResourceExhausted as exc:
            from fastapi.responses import JSONResponse

            status, body = splice_error_body(exc)
            await JSONResponse(body, status_code=status)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            ticket.release()
