"""Splice's model cache ($SPLICE_CACHE/models, else ~/.cache/splice/models): folders built once, atomically.

A build writes into a temporary folder beside its destination and renames it when complete, under a file
lock, so concurrent processes build a model once and readers see a complete folder or none; an interrupted
or failed build leaves nothing half-written behind.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from splice.cache_dir import cache_dir


def cache_root() -> Path:
    """Where built models live."""
    return cache_dir() / "models"


def build_once(out: Path, marker: str, build: Callable[[Path], None], announce: Callable[[], None] | None = None
               ) -> Path:
    """`out`, built by `build(tmp_folder)` unless a complete one (holding `marker`, which `build` writes last)
    exists. `announce` runs only when a build starts."""
    if (out / marker).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same model
        if (out / marker).exists():
            return out
        if announce:
            announce()
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            build(tmp)
            if not (tmp / marker).exists():
                raise RuntimeError(f"the build of {out.name} wrote no {marker}")
            if out.exists():
                shutil.rmtree(out)
            tmp.chmod(0o755)
            for path in tmp.rglob("*"):  # some writers create files readable by their owner only
                path.chmod(0o755 if path.is_dir() else 0o644)
            tmp.rename(out)  # atomic: readers see a complete folder or none
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out
