"""A running service's Prometheus metrics, as the tests and bench scripts read them: the address the service
printed (`NAME metrics on HOST:PORT`, before its ready line) and its samples by name and labels."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from app.launch import Service

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, sorted labels) -> value


def metrics_address(service: Service) -> str:
    """HOST:PORT of the service's /metrics (started with --metrics-port)."""
    pattern = re.compile(rf"^{service.name} metrics on (\S+:\d+)$")
    for line in service.output:
        if match := pattern.match(line):
            return match.group(1)
    raise LookupError(f"{service.name} printed no metrics address (started without --metrics-port?)")


def scrape(where: Service | str) -> Samples:
    """Every sample of a service (or of a metrics HOST:PORT) now."""
    address = metrics_address(where) if isinstance(where, Service) else where
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample with exactly these labels (0 when absent: a counter not yet incremented)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (e.g. over every finish reason)."""
    return sum(v for (n, have), v in samples.items() if n == name and labels.items() <= dict(have).items())
