"""Tiny deterministic models: real HF architectures, random weights, tokenizers built here.

`ensure("tiny-llava")` returns the folder of a cached checkpoint, building it first when missing.
"""

from app.tiny.builder import BUILDER_VERSION, DEFAULT_MODEL, TINY_MODELS, ensure, model_dir

__all__ = ["BUILDER_VERSION", "DEFAULT_MODEL", "TINY_MODELS", "ensure", "model_dir"]
