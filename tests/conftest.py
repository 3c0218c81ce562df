"""Shared fixtures: tiny models built once per session into a cache shared by all test processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"

# Tests and the services they start share one tiny-model cache; CI and developers reuse it across runs.
os.environ.setdefault("SPLICE_CACHE", str(Path(__file__).resolve().parents[1] / ".cache"))
# Two cores: keep torch from oversubscribing them when services and tests run side by side.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_dirs() -> dict[str, Path]:
    from app.tiny import TINY_MODELS, ensure

    return {name: ensure(name) for name in TINY_MODELS}


@pytest.fixture(scope="session")
def shared_models() -> Path:
    if not SHARED_MODELS.is_dir():
        pytest.skip(f"real model files not present at {SHARED_MODELS}")
    return SHARED_MODELS
