"""Where Splice keeps what it builds once and reuses across starts: $SPLICE_CACHE, else ~/.cache/splice (models
under models/, compiled CPU kernels under kernels/)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SPLICE_CACHE, else ~/.cache/splice."""
    return Path(os.environ.get("SPLICE_CACHE", Path.home() / ".cache" / "splice"))
