"""`splice preprocessor` arguments and entry point."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    print("splice preprocessor: not yet implemented in this version (see the open issues).", file=sys.stderr)
    return 2
