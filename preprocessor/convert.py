"""splice.v1 preprocessor requests -> the core's content dataclasses. The only place that reads their protobuf;
replies are written by their own to_pb (outputs.py)."""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf import json_format

from preprocessor.content import (
    Conversation,
    Embeds,
    Image,
    ImageEmbeds,
    Message,
    Part,
    PromptPart,
    RawTensor,
    Text,
    TokenIds,
    Where,
)
from splice.errors import InvalidArgument
from splice.v1 import preprocessor_pb2

Streamed = Mapping[Where, memoryview]  # bytes of tensors that came in an Upload stream, by part


def embeds_from_pb(pb: preprocessor_pb2.PromptEmbeds, where: Where, streamed: Streamed | None = None,
                   label: str = "prompt_embeds") -> Embeds:
    kind = pb.WhichOneof("encoding")
    if kind == "tensor":
        data = streamed[where] if streamed and where in streamed else pb.tensor.data
        payload = RawTensor(pb.tensor.dtype, tuple(pb.tensor.shape), data)
        return Embeds(kind, payload, where, label)
    if kind == "torch_base64":
        return Embeds(kind, pb.torch_base64, where, label)
    if kind == "safetensors":
        return Embeds(kind, pb.safetensors, where, label)
    return Embeds("", b"", where, label)  # raises: no encoding set


def image_embeds_from_pb(pb: preprocessor_pb2.ImageEmbeds, where: Where, streamed: Streamed | None = None,
                         ) -> ImageEmbeds:
    geometry = {key: tuple(value.values) for key, value in pb.geometry.items()}
    return ImageEmbeds(embeds_from_pb(pb.embeds, where, streamed, "image_embeds"), geometry, where)


def image_from_pb(pb: preprocessor_pb2.ImageInput, where: Where) -> Image:
    kind = pb.WhichOneof("source")
    return Image(kind or "", getattr(pb, kind) if kind else b"", where)


def part_from_pb(pb: preprocessor_pb2.ContentPart, where: Where, streamed: Streamed | None = None) -> Part:
    kind = pb.WhichOneof("kind")
    if kind == "text":
        return Text(pb.text, where)
    if kind == "image":
        return image_from_pb(pb.image, where)
    if kind == "prompt_embeds":
        return embeds_from_pb(pb.prompt_embeds, where, streamed)
    if kind == "image_embeds":
        return image_embeds_from_pb(pb.image_embeds, where, streamed)
    raise InvalidArgument(f"{where}: content part has no kind; set text, image, prompt_embeds or image_embeds")


def message_from_pb(pb: preprocessor_pb2.ChatMessage, index: int, streamed: Streamed | None = None) -> Message:
    if pb.HasField("text"):
        if len(pb.content):
            raise InvalidArgument(f"messages[{index}]: set text or content, not both")
        return Message(pb.role, (Text(pb.text, Where(index, 0)),), True, index)
    parts = tuple(part_from_pb(p, Where(index, i), streamed) for i, p in enumerate(pb.content))
    return Message(pb.role, parts, False, index)


def conversation_from_pb(pb: preprocessor_pb2.ChatRequest, streamed: Streamed | None = None) -> Conversation:
    kwargs = json_format.MessageToDict(pb.chat_template_kwargs) if pb.HasField("chat_template_kwargs") else {}
    return Conversation(
        messages=tuple(message_from_pb(m, i, streamed) for i, m in enumerate(pb.messages)),
        add_generation_prompt=pb.add_generation_prompt if pb.HasField("add_generation_prompt") else True,
        chat_template=pb.chat_template if pb.HasField("chat_template") else None,
        template_kwargs=kwargs,
    )


def prompt_from_pb(pb: preprocessor_pb2.CompleteRequest, streamed: Streamed | None = None) -> list[PromptPart]:
    out: list[PromptPart] = []
    for i, part in enumerate(pb.prompt):
        where = Where(None, i)
        kind = part.WhichOneof("kind")
        if kind == "token_ids":
            out.append(TokenIds(tuple(part.token_ids.ids), where))
        elif kind == "text":
            out.append(Text(part.text, where))
        elif kind == "prompt_embeds":
            out.append(embeds_from_pb(part.prompt_embeds, where, streamed))
        else:
            raise InvalidArgument(f"{where}: prompt part has no kind; set token_ids, text or prompt_embeds")
    return out


def add_special_tokens_from_pb(pb: preprocessor_pb2.CompleteRequest | preprocessor_pb2.TokenizeRequest) -> bool:
    """Unset = true: vLLM's default for completions and /tokenize."""
    return pb.add_special_tokens if pb.HasField("add_special_tokens") else True
