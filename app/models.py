"""Resolves a --model value: a tiny built-in name, the built-in real model, a local HF folder, or an HF id."""

from __future__ import annotations

from collections.abc import Callable
from difflib import get_close_matches
from pathlib import Path

from app.hub import NotOnHub, fetch
from app.loras import ensure_lora
from app.loras import parse as parse_lora
from app.real_model import REAL_MODELS, ensure_real
from app.tiny.names import TINY_NAMES
from splice.errors import FailedPrecondition

# (the tiny models' builder, app.tiny, imports torch and transformers: only when a tiny model is built, so that a
# --model that is no model is refused at once)

REAL_WEIGHTS = ("Use --model smollm2-135m-instruct (built in), a local HF folder or an HF id for real weights.")
NOISE_NOTE = "note: {model} is a built-in tiny model with random weights: its answers are noise by construction. "
TRAINED_NOTE = ("note: {model} is a built-in tiny model trained only on a synthetic task (app/tiny/colors.py): "
                "it names a picture's colour and the favourite colour a user states, and nothing else. ")


def model_note(model: str) -> str | None:
    """What to tell a user about `model`'s answers: built-in tiny models answer noise, or only their task."""
    if model not in TINY_NAMES:
        return None
    from app.tiny import TINY_MODELS

    return (TRAINED_NOTE if TINY_MODELS[model].trained else NOISE_NOTE).format(model=model) + REAL_WEIGHTS


# What --model may be besides a built-in name, as the messages say it: an HF id is what the Hub takes, NAME included
HF_ID = "an HF id is ORG/NAME, or NAME for the Hub's models without an organisation"
FOLDER = "a local model is a folder holding config.json"
PATH_STARTS = ("/", "./", "../", "~")


def check_model(name_or_path: str) -> None:
    """FailedPrecondition when `name_or_path` cannot be a model, decided at once, before anything is built, loaded,
    imported or fetched: a folder without config.json, a path that does not exist, a near miss of a built-in name,
    something no HF id looks like."""
    if name_or_path in TINY_NAMES or name_or_path in REAL_MODELS or parse_lora(name_or_path) is not None:
        return
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FailedPrecondition(f"model folder {path} has no config.json")
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    near = [] if "/" in name_or_path else get_close_matches(name_or_path, [*TINY_NAMES, *REAL_MODELS], n=1)
    if near:  # a bare name this close to a built-in one is a typo, not a Hub model without an organisation
        raise FailedPrecondition(f"model {name_or_path!r} is not a built-in model; did you mean {near[0]!r}? "
                                 f"({HF_ID}; {FOLDER})")
    if name_or_path.startswith(PATH_STARTS):  # written as a path: no Hub id looks like one
        raise FailedPrecondition(f"model folder {name_or_path!r} does not exist ({FOLDER})")
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:
        raise FailedPrecondition(f"model {name_or_path!r} is neither a built-in model, a local folder, nor an HF id "
                                 f"({HF_ID}) ({_builtins()})") from None


def _builtins() -> str:
    return f"built-in models: {sorted(TINY_NAMES) + sorted(REAL_MODELS)}"


def resolve_model(name_or_path: str, progress: Callable[[str], None] | None = None, weights: bool = True) -> str:
    """A local folder holding config.json (+ tokenizer, processor, safetensors) for `name_or_path`: a built-in
    model built once, a local folder as it is, or an HF id from the Hugging Face cache, downloaded from the Hub
    when it is not there (`weights=False`: its config and tokenizer files only, what the preprocessor needs)."""
    check_model(name_or_path)
    if name_or_path in TINY_NAMES:
        from app.tiny import ensure

        return str(ensure(name_or_path, progress=progress))
    if name_or_path in REAL_MODELS:
        return str(ensure_real(name_or_path, progress=progress))
    if parse_lora(name_or_path) is not None:  # a built-in LoRA adapter (--lora-modules NAME=tiny-text-lora)
        return str(ensure_lora(name_or_path, progress=progress))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    try:
        return fetch(name_or_path, weights=weights, progress=progress)
    except NotOnHub as exc:
        if "/" in name_or_path:
            raise
        # a bare name is more likely a mistyped built-in than a Hub model without an organisation
        raise NotOnHub(f"{exc.message}; nor is it a local folder or one of the {_builtins()}") from None
