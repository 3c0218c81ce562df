"""Parsed request content: plain dataclasses, one per kind of part, each knowing where it came from.

Decoding (image bytes, tensor encodings) happens later, in images.py / embeds.py, under the limits;
these only carry the caller's payload and its location for error messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from splice.errors import InvalidArgument

# Sources of an image and encodings of prompt embeddings, as named in preprocessor.proto.
IMAGE_SOURCES = ("data", "url", "path")
EMBEDS_ENCODINGS = ("tensor", "torch_base64", "safetensors")


@dataclass(frozen=True)
class Where:
    """Location of a part in the request, for error messages."""

    message: int | None  # index in ChatRequest.messages; None for Complete prompts
    part: int  # index in the message's content (or in CompleteRequest.prompt, or in `field`)
    field: str = "prompt"  # for Complete prompts: the request field holding it (HTTP: "prompt_embeds" too)

    def __str__(self) -> str:
        if self.message is None:
            return f"{self.field}[{self.part}]"
        return f"messages[{self.message}].content[{self.part}]"


@dataclass(frozen=True)
class Text:
    text: str
    where: Where


@dataclass(frozen=True)
class TokenIds:
    ids: tuple[int, ...]
    where: Where


@dataclass(frozen=True)
class Image:
    source: str  # one of IMAGE_SOURCES
    value: bytes | str  # bytes for "data", the URL for "url", the path for "path"
    where: Where

    def __post_init__(self) -> None:
        if self.source not in IMAGE_SOURCES:
            raise InvalidArgument(f"{self.where}: image has no source; set data, url or path")


@dataclass(frozen=True)
class RawTensor:
    """splice.v1.Tensor, not yet checked or allocated."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview  # a memoryview: assembled from an Upload stream, used without a copy


@dataclass(frozen=True)
class Embeds:
    encoding: str  # one of EMBEDS_ENCODINGS
    payload: RawTensor | str | bytes  # RawTensor for "tensor", str for "torch_base64", bytes for "safetensors"
    where: Where
    label: str = "prompt_embeds"  # what messages call the rows: "prompt_embeds", or "image_embeds" (ImageEmbeds)

    def __post_init__(self) -> None:
        if self.encoding not in EMBEDS_ENCODINGS:
            raise InvalidArgument(f"{self.where}: {self.label} has no encoding; set tensor, torch_base64 or "
                                  f"safetensors")


# A geometry value as sent: integers (gRPC Integers; a JSON integer or list, nested or not), or base64 of
# torch.save(tensor).
GeometryValue = tuple[int, ...] | int | list | str


@dataclass(frozen=True)
class ImageEmbeds:
    """Precomputed features of one image (vLLM's image_embeds part), decoded by mm_embeds.py."""

    embeds: Embeds  # the rows [rows, hidden] (label "image_embeds")
    geometry: dict[str, GeometryValue]  # what the model family needs beside them, by vLLM's key names
    where: Where


Part = Text | Image | Embeds | ImageEmbeds
PromptPart = Text | TokenIds | Embeds


@dataclass(frozen=True)
class Message:
    role: str
    parts: tuple[Part, ...]
    as_string: bool  # the caller used the plain-string form (ChatMessage.text)
    index: int
    # what templates read besides role and content: an assistant's tool_calls, a tool reply's tool_call_id, name
    fields: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.role:
            raise InvalidArgument(f"messages[{self.index}]: role is empty")
        if not self.parts:
            raise InvalidArgument(f"messages[{self.index}]: content is empty; send text or at least one content part")


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]
    add_generation_prompt: bool = True
    chat_template: str | None = None  # overrides the model's template
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # The final message is left open for the answer to continue it (HF's apply_chat_template argument).
    continue_final_message: bool = False
    # The tokenizer's special tokens on top of what the template wrote (vLLM's chat add_special_tokens).
    add_special_tokens: bool = False
    # Arguments of the model's image processor (vLLM's mm_processor_kwargs), checked by mm_kwargs.py.
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.messages:
            raise InvalidArgument("messages is empty")
        if self.continue_final_message and self.add_generation_prompt:
            raise InvalidArgument("continue_final_message and add_generation_prompt cannot both be true: the "
                                  "answer either continues the final message or starts a new one")

    def parts(self, kind: type) -> list:
        return [p for m in self.messages for p in m.parts if isinstance(p, kind)]

    @property
    def image_count(self) -> int:
        """Images: pictures and precomputed image features alike (each fills one image placeholder)."""
        return len(self.parts(Image | ImageEmbeds))
