"""`splice up`'s supervision: a service that exits without being asked is restarted on its own port with its
own flags, after a backoff that doubles per consecutive failure (a service that stayed up a while starts
over). Each failure and each restart is one line; the other service keeps serving meanwhile (the
preprocessor waits for a restarted engine and reports NOT_SERVING until it is back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from app.launch import Service, StartFailed, start

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
STABLE_SECONDS = 60.0  # up this long: the next failure backs off from FIRST_BACKOFF again


class Supervisor:
    def __init__(self, services: list[Service], say: Callable[[str], None],
                 echo: Callable[[str], None] | None = None) -> None:
        self.services = services
        self._say, self._echo = say, echo
        self._backoff = {s.name: FIRST_BACKOFF for s in services}
        self._since = {s.name: time.monotonic() for s in services}
        self.restarts = 0

    def run(self, stop: threading.Event, poll: float = 0.5) -> None:
        """Watches until `stop` is set."""
        while not stop.wait(poll):
            for i, service in enumerate(self.services):
                if not service.alive:
                    self.services[i] = self._revive(service, stop)

    def _revive(self, dead: Service, stop: threading.Event) -> Service:
        name = dead.name
        if time.monotonic() - self._since[name] > STABLE_SECONDS:
            self._backoff[name] = FIRST_BACKOFF
        code = dead.proc.returncode
        why = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        while not stop.is_set():
            delay = self._backoff[name]
            self._backoff[name] = min(delay * 2, MAX_BACKOFF)
            self._say(f"splice up: {name} {why}; restarting in {delay:g} s")
            if stop.wait(delay):
                break
            try:
                service = start(name, dead.restart_args(), echo=self._echo)
            except StartFailed as exc:
                why = f"did not restart ({exc.reason})"
                continue
            self.restarts += 1
            self._since[name] = time.monotonic()
            self._say(f"splice up: {name} serving again on {service.address}")
            return service
        return dead
