"""Resolves a --model value: a tiny built-in name, the built-in real model, a local HF folder, or an HF id."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.real_model import REAL_MODELS, ensure_real
from app.tiny import TINY_MODELS, ensure
from splice.errors import FailedPrecondition

REAL_WEIGHTS = ("Use --model smollm2-135m-instruct (built in), a local HF folder or an HF id for real weights.")
NOISE_NOTE = "note: {model} is a built-in tiny model with random weights: its answers are noise by construction. "
TRAINED_NOTE = ("note: {model} is a built-in tiny model trained only on a synthetic task (app/tiny/colors.py): "
                "it names a picture's colour and the favourite colour a user states, and nothing else. ")


def model_note(model: str) -> str | None:
    """What to tell a user about `model`'s answers: built-in tiny models answer noise, or only their task."""
    if model not in TINY_MODELS:
        return None
    return (TRAINED_NOTE if TINY_MODELS[model].trained else NOISE_NOTE).format(model=model) + REAL_WEIGHTS


def resolve_model(name_or_path: str, progress: Callable[[str], None] | None = None) -> str:
    """A local folder holding config.json (+ tokenizer, processor, safetensors) for `name_or_path`."""
    if name_or_path in TINY_MODELS:
        return str(ensure(name_or_path, progress=progress))
    if name_or_path in REAL_MODELS:
        return str(ensure_real(name_or_path, progress=progress))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FailedPrecondition(f"model folder {path} has no config.json")
        return str(path)
    # An HF id: only what is already in the local cache; nothing is downloaded at run time.
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name_or_path, local_files_only=True)
    except Exception as exc:
        raise FailedPrecondition(
            f"model {name_or_path!r} is neither a tiny model ({sorted(TINY_MODELS)}), a local folder, nor an HF id "
            f"in the local cache ({type(exc).__name__}); download it first or pass a folder") from exc
