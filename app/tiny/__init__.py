"""Tiny deterministic models: real HF architectures, tokenizers built here; random weights, except the default
(tiny-idefics3-colors), trained here on a synthetic colour task (colors.py, train.py).

`ensure("tiny-llava")` returns the folder of a cached checkpoint, building it first when missing.

The builder (torch, transformers) is imported on first use of one of its names, so that importing
`app.tiny.names` (the CLI's --help) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from app.tiny.names import DEFAULT_MODEL

if TYPE_CHECKING:
    from app.tiny.builder import BUILDER_VERSION, TINY_MODELS, ensure, model_dir

__all__ = ["BUILDER_VERSION", "DEFAULT_MODEL", "TINY_MODELS", "ensure", "model_dir"]


def __getattr__(name: str) -> Any:
    if name in ("BUILDER_VERSION", "TINY_MODELS", "ensure", "model_dir"):
        return getattr(importlib.import_module("app.tiny.builder"), name)
    raise AttributeError(f"module 'app.tiny' has no attribute {name!r}")
