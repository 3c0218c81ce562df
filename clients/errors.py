"""Errors surfaced to client code: the server's gRPC status and message, as one exception type."""

from __future__ import annotations

import grpc


class SpliceClientError(Exception):
    """A failed call; `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> SpliceClientError:
        return cls(err.code(), err.details() or "")
