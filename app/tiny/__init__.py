"""Tiny deterministic models: real HF architectures, tokenizers built here; random weights, except the default
(tiny-idefics3-colors), trained here on a synthetic colour task (colors.py, train.py).

`ensure("tiny-llava")` returns the folder of a cached checkpoint, building it first when missing.
"""

from app.tiny.builder import BUILDER_VERSION, DEFAULT_MODEL, TINY_MODELS, ensure, model_dir

__all__ = ["BUILDER_VERSION", "DEFAULT_MODEL", "TINY_MODELS", "ensure", "model_dir"]
