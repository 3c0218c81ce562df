"""python -m app.tiny [NAME ...]: build (or find) the tiny models and print their folders."""

from __future__ import annotations

import argparse

from app.tiny.builder import DEFAULT_SEED, TINY_MODELS, ensure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"any of {sorted(TINY_MODELS)} (default: all)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args()
    for name in args.names or sorted(TINY_MODELS):
        print(f"{name}: {ensure(name, args.seed, progress=print)}")


if __name__ == "__main__":
    main()
