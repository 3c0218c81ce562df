"""`--api-key` / SPLICE_API_KEY: the HTTP face's bearer token (the gRPC face is not covered here)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import Request

from splice.errors import Unauthenticated


def bearer_check(api_key: str | None) -> Callable[[Request], None]:
    """A FastAPI dependency: no-op without a key, else 401 unless `Authorization: Bearer KEY`."""
    expected = f"Bearer {api_key}".encode() if api_key else None

    def check(request: Request) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise Unauthenticated("missing or wrong API key: send 'Authorization: Bearer KEY'")

    return check
