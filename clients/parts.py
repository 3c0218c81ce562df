"""Builders of content parts and messages from Python values (str, PIL image, path, bytes, tensor)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from splice.tensors import tensor_to_pb
from splice.v1 import preprocessor_pb2 as pp

PartLike = Any  # str | PIL.Image.Image | bytes | Path | torch.Tensor | dict | pp.ContentPart


def text_part(text: str) -> pp.ContentPart:
    return pp.ContentPart(text=text)


def image_part(image: Any, *, as_path: bool = False) -> pp.ContentPart:
    """A PIL image, encoded bytes, a data: URL, or a file path. A path is read here and sent as bytes,
    unless `as_path` asks the server to read it from its allowed media directory."""
    if isinstance(image, bytes | bytearray):
        return pp.ContentPart(image=pp.ImageInput(data=bytes(image)))
    if isinstance(image, str) and image.startswith("data:"):
        return pp.ContentPart(image=pp.ImageInput(url=image))
    if isinstance(image, str | Path):
        if as_path:
            return pp.ContentPart(image=pp.ImageInput(path=str(image)))
        return pp.ContentPart(image=pp.ImageInput(data=Path(image).read_bytes()))
    if hasattr(image, "save"):  # PIL.Image.Image, without importing PIL for every caller
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return pp.ContentPart(image=pp.ImageInput(data=buf.getvalue()))
    raise TypeError(f"cannot make an image part from {type(image).__name__}")


def embeds_part(embeds: torch.Tensor) -> pp.ContentPart:
    """Prompt embeddings [n, hidden] (or [1, n, hidden]) sent as a raw tensor."""
    return pp.ContentPart(prompt_embeds=pp.PromptEmbeds(tensor=tensor_to_pb(embeds)))


def to_part(item: PartLike) -> pp.ContentPart:
    if isinstance(item, pp.ContentPart):
        return item
    if isinstance(item, str):
        return text_part(item)
    if isinstance(item, torch.Tensor):
        return embeds_part(item)
    if isinstance(item, dict):  # OpenAI-like {"type": "text"|"image"|"prompt_embeds", ...}
        kind = item.get("type")
        if kind == "text":
            return text_part(item["text"])
        if kind == "image":
            return image_part(item["image"])
        if kind == "prompt_embeds":
            return embeds_part(item["prompt_embeds"])
        raise ValueError(f"unknown content part type {kind!r}")
    return image_part(item)


def message(role: str, content: str | Iterable[PartLike]) -> pp.ChatMessage:
    """A chat message; string content stays a string (OpenAI's string form)."""
    if isinstance(content, str):
        return pp.ChatMessage(role=role, text=content)
    return pp.ChatMessage(role=role, content=[to_part(c) for c in content])


def to_message(m: pp.ChatMessage | dict) -> pp.ChatMessage:
    if isinstance(m, pp.ChatMessage):
        return m
    return message(m["role"], m["content"])
