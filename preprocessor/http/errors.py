"""Errors as OpenAI's body `{"error": {"message", "type", "param", "code"}}`, one HTTP status per gRPC status.

The core raises the same SpliceError subclasses for both faces; their `code` (a gRPC status name) picks
the HTTP status here, as splice/grpc_errors.py picks the gRPC one. Malformed bodies are 400, never 500.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from splice.errors import SpliceError

log = logging.getLogger(__name__)

HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ABORTED": 409,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "INTERNAL": 500,
    "UNKNOWN": 500,
    "DATA_LOSS": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 429: "rate_limit_error"}
MAX_VALIDATION_ERRORS = 3


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status)


def splice_error_body(exc: SpliceError) -> tuple[int, dict]:
    status = HTTP_STATUS.get(exc.code, 500)
    return status, error_body(status, exc.message, exc.code)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({detail})", None
    parts, params = [], []
    for e in errors[:MAX_VALIDATION_ERRORS]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        params.append(loc)
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - MAX_VALIDATION_ERRORS} more)" if len(errors) > MAX_VALIDATION_ERRORS else ""
    return "; ".join(parts) + more, params[0] if params else None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SpliceError)
    async def _splice(request: Request, exc: SpliceError) -> JSONResponse:
        status, body = splice_error_body(exc)
        if status >= 500 and exc.code != "UNAVAILABLE":
            log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, "INVALID_ARGUMENT", param)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "NOT_FOUND", 405: "UNIMPLEMENTED", 408: "DEADLINE_EXCEEDED", 413: "RESOURCE_EXHAUSTED",
                429: "RESOURCE_EXHAUSTED"}.get(exc.status_code, "INVALID_ARGUMENT")
        return error_response(exc.status_code, str(exc.detail), code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "INTERNAL")
