"""Builders of content parts and messages from Python values (str, PIL image, path, bytes, tensor)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from splice.tensors import dtype_name, tensor_to_pb
from splice.v1 import common_pb2
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


def image_embeds_part(embeds: torch.Tensor, deferred: list[torch.Tensor] | None = None,
                      **geometry: Iterable[int] | int) -> pp.ContentPart:
    """Precomputed features of one image [rows, hidden] (or [1, rows, hidden]), with what the model family needs
    beside them by vLLM's key names (image_grid_thw=(1, 4, 4), image_sizes=(h, w), rows=2, cols=2, ...). The server
    must run with --enable-mm-embeds."""
    values = {k: pp.Integers(values=[int(v)] if isinstance(v, int) else [int(x) for x in v])
              for k, v in geometry.items()}
    return pp.ContentPart(image_embeds=pp.ImageEmbeds(embeds=declared_embeds(embeds, deferred), geometry=values))


def declared_embeds(embeds: torch.Tensor, deferred: list[torch.Tensor] | None) -> pp.PromptEmbeds:
    """A raw-tensor PromptEmbeds; with `deferred`, its bytes are left out (dtype and shape only) and the tensor is
    appended there, to be streamed after the request (Upload)."""
    if deferred is None or embeds.numel() == 0:
        return pp.PromptEmbeds(tensor=tensor_to_pb(embeds))
    deferred.append(embeds)
    return pp.PromptEmbeds(tensor=common_pb2.Tensor(dtype=dtype_name(embeds.dtype), shape=list(embeds.shape)))


def to_part(item: PartLike, deferred: list[torch.Tensor] | None = None) -> pp.ContentPart:
    if isinstance(item, pp.ContentPart):
        return item
    if isinstance(item, str):
        return text_part(item)
    if isinstance(item, torch.Tensor):
        return pp.ContentPart(prompt_embeds=declared_embeds(item, deferred))
    if isinstance(item, dict):  # OpenAI-like {"type": "text"|"image"|"prompt_embeds"|"image_embeds", ...}
        kind = item.get("type")
        if kind == "text":
            return text_part(item["text"])
        if kind == "image":
            return image_part(item["image"])
        if kind == "prompt_embeds":
            return pp.ContentPart(prompt_embeds=declared_embeds(item["prompt_embeds"], deferred))
        if kind == "image_embeds":  # {"type": "image_embeds", "image_embeds": tensor, geometry key: integers, ...}
            geometry = {k: v for k, v in item.items() if k not in ("type", "image_embeds")}
            return image_embeds_part(item["image_embeds"], deferred, **geometry)
        raise ValueError(f"unknown content part type {kind!r}")
    return image_part(item)


def message(role: str, content: str | Iterable[PartLike],
            deferred: list[torch.Tensor] | None = None) -> pp.ChatMessage:
    """A chat message; string content stays a string (OpenAI's string form)."""
    if isinstance(content, str):
        return pp.ChatMessage(role=role, text=content)
    return pp.ChatMessage(role=role, content=[to_part(c, deferred) for c in content])


def to_message(m: pp.ChatMessage | dict, deferred: list[torch.Tensor] | None = None) -> pp.ChatMessage:
    """A dict as OpenAI's: role, content (None with tool_calls), and tool_calls, tool_call_id, name."""
    if isinstance(m, pp.ChatMessage):
        return m
    content = m.get("content")
    pb = message(m["role"], content, deferred) if content is not None else pp.ChatMessage(role=m["role"])
    for call in m.get("tool_calls") or ():
        pb.tool_calls.add().update(call)
    if m.get("tool_call_id") is not None:
        pb.tool_call_id = m["tool_call_id"]
    if m.get("name") is not None:
        pb.name = m["name"]
    return pb
