"""Errors the core raises; the servicers' call guard (splice/call_guard.py) maps each to its gRPC status code.

The core never imports grpc: it raises these with a message naming the offending part.
"""

from __future__ import annotations


class SpliceError(Exception):
    """Base class; `code` names a grpc.StatusCode member. `param`: the request field at fault, where there is one
    (the HTTP error body's `param`, as vLLM names it); the message names it too, for gRPC callers."""

    code = "INTERNAL"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidArgument(SpliceError):
    """The request itself is wrong (bad ID, shape, dtype, template, sampling value...)."""

    code = "INVALID_ARGUMENT"


class NotFound(SpliceError):
    """The request names something this server does not have (e.g. another model)."""

    code = "NOT_FOUND"


class FailedPrecondition(SpliceError):
    """The request is well formed but this deployment cannot serve it (e.g. images on a text model)."""

    code = "FAILED_PRECONDITION"


class ResourceExhausted(SpliceError):
    """A server-side limit (queue full) refuses the request for now."""

    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(SpliceError):
    """A time limit of this server ran out (e.g. a client stream went silent mid-upload)."""

    code = "DEADLINE_EXCEEDED"


class Unavailable(SpliceError):
    """A dependency (the engine) cannot be reached."""

    code = "UNAVAILABLE"


class Unauthenticated(SpliceError):
    """The caller did not present the key this server requires."""

    code = "UNAUTHENTICATED"


def error_with_code(code: str, message: str) -> SpliceError:
    """The SpliceError of a status code name (an error that crossed a process boundary as text)."""
    for cls in SpliceError.__subclasses__():
        if cls.code == code:
            return cls(message)
    return SpliceError(message)
