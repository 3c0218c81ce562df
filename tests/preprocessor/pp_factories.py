"""Factories for the preprocessor's unit tests: model files and the engine's ModelInfo, no engine process."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from PIL import Image as PILImage

from preprocessor.answer import Asked, chat
from preprocessor.content import Conversation, Embeds, Image, ImageEmbeds, Message, RawTensor, Text, Where
from preprocessor.core import PreprocessorCore
from preprocessor.limits import Limits
from preprocessor.model_files import ModelFiles, load_model_files, load_processor
from preprocessor.outputs import Answered, GenerationChunk
from preprocessor.template_sandbox import TemplateSandbox
from splice.model_info import IMAGE, PROMPT_EMBEDS, TEXT, ModelInfo
from splice.sampling import SamplingParams

_FILES: dict[str, ModelFiles] = {}
TRUSTING = Limits(trust_request_chat_template=True)
_SANDBOX: list[TemplateSandbox] = []


def model_info_from_config(path: str | Path, dtype: str = "float32") -> ModelInfo:
    """What an engine serving `path` would report, read from its config.json (not from the tokenizer)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)  # class defaults fill what config.json leaves out
    text = config.get_text_config()
    image_token = getattr(config, "image_token_id", None)
    if image_token is None:
        image_token = getattr(config, "image_token_index", None)
    kinds = (TEXT, PROMPT_EMBEDS) + ((IMAGE,) if image_token is not None else ())
    eos = text.eos_token_id
    return ModelInfo(model=str(path), architecture=config.architectures[0], vocab_rows=text.vocab_size,
                     hidden_size=text.hidden_size, dtype=dtype, max_model_len=text.max_position_embeddings,
                     image_token_id=image_token, input_kinds=kinds,
                     eos_token_ids=tuple(eos if isinstance(eos, list) else [eos] if eos is not None else []))


def hf_processor(path: str | Path):
    """The model's own HF processor with PIL image processors (AutoProcessor, backend="pil"); for processors
    transformers ships only with torchvision parts, built from their loadable parts (processor_parts.py)."""
    return load_processor(path)


def files_for(path: str | Path) -> ModelFiles:
    key = str(path)
    if key not in _FILES:  # loading a processor takes a second; the files are read-only afterwards
        _FILES[key] = load_model_files(path)
    return _FILES[key]


def trusting_core(files: ModelFiles, info: ModelInfo) -> PreprocessorCore:
    """A core that accepts request chat templates, all such cores sharing one sandbox (its workers start once)."""
    if not _SANDBOX:
        _SANDBOX.append(TemplateSandbox(TRUSTING.chat_template_workers, TRUSTING.chat_template_timeout))
    return PreprocessorCore(files, info, limits=TRUSTING, sandbox=_SANDBOX[0])


def picture(w: int, h: int, seed: int = 0) -> PILImage.Image:
    pixels = bytes((x * 7 + y * 3 + c * 50 + seed) % 256 for y in range(h) for x in range(w) for c in range(3))
    return PILImage.frombytes("RGB", (w, h), pixels)


def png_bytes(w: int = 70, h: int = 45, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    picture(w, h, seed).save(buf, format="PNG")
    return buf.getvalue()


def raw(t: torch.Tensor) -> RawTensor:
    from splice.tensors import dtype_name, to_bytes

    return RawTensor(dtype_name(t.dtype), tuple(t.shape), to_bytes(t))


def rows(n: int, hidden: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, hidden, generator=g)  # [n, hidden]


def conversation(*messages: tuple[str, list], **kw) -> Conversation:
    """messages: (role, parts) where parts are str (text), bytes (image), tensors (prompt_embeds), or dicts
    {"image_embeds": tensor, geometry key: integers, ...} (image_embeds)."""
    out = []
    for mi, (role, parts) in enumerate(messages):
        if isinstance(parts, str):
            out.append(Message(role, (Text(parts, Where(mi, 0)),), True, mi))
            continue
        built = []
        for pi, p in enumerate(parts):
            where = Where(mi, pi)
            if isinstance(p, str):
                built.append(Text(p, where))
            elif isinstance(p, bytes):
                built.append(Image("data", p, where))
            elif isinstance(p, dict):
                geometry = {k: tuple(v) if isinstance(v, list | tuple) else (v,) for k, v in p.items()
                            if k != "image_embeds"}
                built.append(ImageEmbeds(Embeds("tensor", raw(p["image_embeds"]), where, "image_embeds"), geometry,
                                         where))
            else:
                built.append(Embeds("tensor", raw(p), where))
        out.append(Message(role, tuple(built), False, mi))
    return Conversation(tuple(out), **kw)


async def chat_chunks(core: PreprocessorCore, conv: Conversation, sampling: SamplingParams,
                      asked: Asked | None = None) -> list[GenerationChunk]:
    """A conversation's answer as the pipeline streams it (answer.chat): its chunks, the events before Answered."""
    events = [e async for e in chat(core, conv, sampling, asked or Asked())]
    assert isinstance(events[-1], Answered) and not any(isinstance(e, Answered) for e in events[:-1])
    return events[:-1]
