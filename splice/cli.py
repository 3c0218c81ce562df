"""`splice` command line: engine, preprocessor, up, chat, demo, build-tiny."""

from __future__ import annotations

import argparse
import sys

from splice.tiny import DEFAULT_MODEL


def _not_yet(what: str) -> int:
    print(f"splice {what}: not yet implemented in this version (see the open issues).", file=sys.stderr)
    return 2


def _build_tiny(args: argparse.Namespace) -> int:
    from splice.tiny import TINY_MODELS, ensure

    for name in args.names or sorted(TINY_MODELS):
        print(f"{name}: {ensure(name, progress=print)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splice", description="Serve chat models with text, images and "
                                     "caller-supplied prompt embeddings.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build-tiny", help="build the tiny built-in models into the cache")
    p.add_argument("names", nargs="*")
    p.set_defaults(func=_build_tiny)

    from engine import cli as engine_cli
    from preprocessor import cli as preprocessor_cli

    p = sub.add_parser("engine", help="serve splice.v1.Engine (model on GPU/CPU)")
    engine_cli.add_arguments(p)
    p.set_defaults(func=engine_cli.run)

    p = sub.add_parser("preprocessor", help="serve splice.v1.Preprocessor (public API, CPU)")
    preprocessor_cli.add_arguments(p)
    p.set_defaults(func=preprocessor_cli.run)

    for name in ("up", "chat"):
        p = sub.add_parser(name, help=f"{name} (not yet)")
        p.set_defaults(func=lambda a, n=name: _not_yet(n))

    p = sub.add_parser("demo", help=f"run the seed scenario on the built-in {DEFAULT_MODEL}")
    p.set_defaults(func=lambda a: _not_yet("demo"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
