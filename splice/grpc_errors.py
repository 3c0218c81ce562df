"""Errors -> gRPC status codes, for splice.call_guard: SpliceError -> its code; anything else -> INTERNAL, logged.

Servicers stay thin: they raise the core's errors and never call context.abort themselves.

Requests that do not parse (malformed protobuf, invalid UTF-8 in a string field) are the caller's fault:
gRPC would answer UNKNOWN and log a traceback from inside its deserializer, so the deserializer is wrapped
to hand the guard a Malformed marker instead, which becomes INVALID_ARGUMENT and one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from splice.errors import InvalidArgument, SpliceError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Malformed:
    """What a request message that did not parse deserializes to."""

    reason: str


def tolerant(deserializer: Callable[[bytes], object] | None) -> Callable[[bytes], object] | None:
    """`deserializer`, answering Malformed instead of raising on bytes that do not parse."""
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> object:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, UnicodeDecodeError, whatever the runtime raises
            return Malformed(f"{type(exc).__name__}: {exc}")

    return deserialize


def refusal(method: str, bad: Malformed) -> InvalidArgument:
    """The INVALID_ARGUMENT a malformed request message of `method` gets (and its one log line)."""
    log.warning("%s: malformed request message (%s)", method, bad.reason)
    return InvalidArgument(f"the request message does not parse as {method.rsplit('/', 1)[-1]}'s request type: "
                           f"{bad.reason} (malformed protobuf or invalid UTF-8 in a string field)")


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message `exc` is answered with: a SpliceError's own, INTERNAL for anything else."""
    if isinstance(exc, SpliceError):
        return grpc.StatusCode[exc.code], exc.message
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


async def abort_with(context: grpc.aio.ServicerContext, method: str, exc: Exception) -> None:
    """Ends the call with `exc`'s status (an unexpected error is logged with its traceback)."""
    if isinstance(exc, grpc.aio.AbortError):  # the handler aborted with its own status already
        raise exc
    code, message = status_of(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    await context.abort(code, message)
