"""Command-line flags as data: one `flag(...)` declaration per flag (argparse's add_argument arguments), in tables by
group (the groups of docs/operations.md), added to a parser in order. Shared by the `splice` commands."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]  # "--name" (and its aliases), or a positional's name
    options: dict[str, Any]  # add_argument's keyword arguments: type, default, help, ...


def flag(*names: str, **options: Any) -> Flag:
    return Flag(names, options)


class Arguments(Protocol):
    """A parser, or one of its argument groups."""

    def add_argument(self, *names: str, **options: Any) -> Any: ...


def add_flags(parser: Arguments, *groups: Iterable[Flag]) -> None:
    """Each group's flags, in order (the order --help lists them in)."""
    for group in groups:
        for f in group:
            parser.add_argument(*f.names, **f.options)


def json_flag(kind: type) -> Callable[[str], Any]:
    """A flag's JSON value, of this JSON type (dict: an object, list: an array)."""
    name = {dict: "object", list: "array"}[kind]

    def parse(text: str) -> Any:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text[:60]!r}") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {name}, got {text[:60]!r}")
        return value

    return parse
