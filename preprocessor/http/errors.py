"""Errors as vLLM's body `{"error": {"message", "type", "param", "code"}}` (`code` the HTTP status, `type` vLLM's
class name, `param` the request field at fault), one HTTP status per gRPC status.

The core raises the same SpliceError subclasses for both faces; their `code` (a gRPC status name) picks
the HTTP status here, as splice/grpc_errors.py picks the gRPC one, and their `param` is the body's. Malformed bodies
are 400, never 500.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from preprocessor.http.schemas import ChatCompletionRequest, CompletionRequest
from splice.errors import SpliceError

log = logging.getLogger(__name__)


class SpliceHTTPError(HTTPException):
    """An HTTP status the face itself answers with (a body too large or too slow, no room for it), in vLLM's error
    body."""

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
# vLLM's `type` per status: the openai SDK's exception class names (vLLM's create_error_response), and for a status
# with no such class the status's phrase (vLLM's GracefulHTTPError and HTTPException handlers)
_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
          409: "ConflictError", 422: "UnprocessableEntityError", 429: "RateLimitError", 500: "InternalServerError",
          501: "NotImplementedError", 503: "ServiceUnavailableError"}
# pydantic errors vLLM's own models raise too (a wrong type, a missing field, malformed JSON): its validation
# handler's `type` (the status's phrase) and `param` (the field's dotted place, body first). Range errors are
# vLLM's later checks (VLLMValidationError: BadRequestError, the field's name).
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long"}
MAX_VALIDATION_ERRORS = 3


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # (499, nginx's: a client that went away)
        return "Client Closed Request"


def error_body(status: int, message: str, param: str | None = None, kind: str | None = None) -> dict:
    """vLLM's ErrorResponse: `code` the HTTP status, `type` its class name (error_type unless `kind`), `param` the
    request field at fault where one is."""
    return {"error": {"message": message, "type": kind or error_type(status), "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None, kind: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, kind), status_code=status)


# A message names the field at fault first ("temperature must be ...", "logit_bias: token ID ..."; SamplingParams'
# "sampling.top_p ..."): that field is the error's `param` unless the error names one itself.
_LEADING_NAME = re.compile(r"(?:sampling\.)?([a-z_]+)")
FIELDS = frozenset(ChatCompletionRequest.model_fields) | frozenset(CompletionRequest.model_fields)


def param_of(exc: SpliceError) -> str | None:
    if exc.param is not None:
        return exc.param
    leading = _LEADING_NAME.match(exc.message)
    return leading.group(1) if leading and leading.group(1) in FIELDS else None


def splice_error_body(exc: SpliceError) -> tuple[int, dict]:
    status = HTTP_STATUS.get(exc.code, 500)
    return status, error_body(status, exc.message, param_of(exc))


def _loc(loc: tuple) -> str:
    return ".".join(str(x) for x in loc)


def _validation_error(exc: RequestValidationError) -> tuple[str, str | None, str | None]:
    """(message, param, type) of a request pydantic refused."""
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        invalid = next(e for e in errors if e.get("type") == "json_invalid")
        return (f"the request body is not valid JSON ({invalid.get('ctx', {}).get('error', '')})",
                _loc(invalid.get("loc", ("body",))), HTTPStatus.BAD_REQUEST.phrase)
    parts = []
    for e in errors[:MAX_VALIDATION_ERRORS]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - MAX_VALIDATION_ERRORS} more)" if len(errors) > MAX_VALIDATION_ERRORS else ""
    if not errors:
        return "the request is not valid", None, HTTPStatus.BAD_REQUEST.phrase
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    if first.get("type") in _RANGE_ERRORS and len(loc) > 1:  # a value out of range: vLLM's later check names it
        return "; ".join(parts) + more, str(loc[1]), None
    return "; ".join(parts) + more, _loc(loc) or None, HTTPStatus.BAD_REQUEST.phrase


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SpliceError)
    async def _splice(request: Request, exc: SpliceError) -> JSONResponse:
        status, body = splice_error_body(exc)
        if status >= 500 and exc.code != "UNAVAILABLE":
            log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, kind = _validation_error(exc)
        return error_response(400, message, param, kind)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc, SpliceHTTPError):
            return error_response(exc.status_code, str(exc.detail))
        # the router's own (no such route, method not allowed): FastAPI's body, as vLLM answers them
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
