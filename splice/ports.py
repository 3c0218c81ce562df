"""Whether the ports a command will listen on can be had, checked before anything slow (loading a model) starts,
so that a busy port is one line naming the flag that moves it."""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence
from typing import NamedTuple


class Listen(NamedTuple):
    flag: str  # the flag that chooses this port, named in the error
    host: str
    port: int  # 0: any free one, nothing to check


def first_unbindable(listens: Sequence[Listen]) -> str | None:
    """The reason the first of `listens` cannot be bound (in use, not permitted, given twice), or None."""
    seen: dict[int, str] = {}
    for flag, host, port in listens:
        if port == 0:
            continue
        if port in seen:
            return f"{flag} and {seen[port]} are both {port}: pass another to one of them"
        seen[port] = flag
        reason = _bind_error(host, port)
        if reason:
            return f"port {port} on {host} {reason}: pass {flag} to choose another (0: a free one)"
    return None


def _bind_error(host: str, port: int) -> str | None:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return f"cannot be resolved ({exc.strerror or exc})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        # as the servers bind: a port left in TIME_WAIT by a stopped server is free to them
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            return "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror or exc})"
    return None
