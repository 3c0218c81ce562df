"""splice.v1 preprocessor requests -> the core's content dataclasses. The only place that reads their protobuf;
replies are written by their own to_pb (outputs.py)."""

from __future__ import annotations

from google.protobuf import json_format

from preprocessor.content import (
    Conversation,
    Embeds,
    Image,
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


def embeds_from_pb(pb: preprocessor_pb2.PromptEmbeds, where: Where) -> Embeds:
    kind = pb.WhichOneof("encoding")
    if kind == "tensor":
        payload = RawTensor(pb.tensor.dtype, tuple(pb.tensor.shape), pb.tensor.data)
        return Embeds(kind, payload, where)
    if kind == "torch_base64":
        return Embeds(kind, pb.torch_base64, where)
    if kind == "safetensors":
        return Embeds(kind, pb.safetensors, where)
    return Embeds("", b"", where)  # raises: no encoding set


def image_from_pb(pb: preprocessor_pb2.ImageInput, where: Where) -> Image:
    kind = pb.WhichOneof("source")
    return Image(kind or "", getattr(pb, kind) if kind else b"", where)


def part_from_pb(pb: preprocessor_pb2.ContentPart, where: Where) -> Part:
    kind = pb.WhichOneof("kind")
    if kind == "text":
        return Text(pb.text, where)
    if kind == "image":
        return image_from_pb(pb.image, where)
    if kind == "prompt_embeds":
        return embeds_from_pb(pb.prompt_embeds, where)
    raise InvalidArgument(f"{where}: content part has no kind; set text, image or prompt_embeds")


def message_from_pb(pb: preprocessor_pb2.ChatMessage, index: int) -> Message:
    if pb.HasField("text"):
        if len(pb.content):
            raise InvalidArgument(f"messages[{index}]: set text or content, not both")
        return Message(pb.role, (Text(pb.text, Where(index, 0)),), True, index)
    parts = tuple(part_from_pb(p, Where(index, i)) for i, p in enumerate(pb.content))
    return Message(pb.role, parts, False, index)


def conversation_from_pb(pb: preprocessor_pb2.ChatRequest) -> Conversation:
    kwargs = json_format.MessageToDict(pb.chat_template_kwargs) if pb.HasField("chat_template_kwargs") else {}
    return Conversation(
        messages=tuple(message_from_pb(m, i) for i, m in enumerate(pb.messages)),
        add_generation_prompt=pb.add_generation_prompt if pb.HasField("add_generation_prompt") else True,
        chat_template=pb.chat_template if pb.HasField("chat_template") else None,
        template_kwargs=kwargs,
    )


def prompt_from_pb(pb: preprocessor_pb2.CompleteRequest) -> list[PromptPart]:
    out: list[PromptPart] = []
    for i, part in enumerate(pb.prompt):
        where = Where(None, i)
        kind = part.WhichOneof("kind")
        if kind == "token_ids":
            out.append(TokenIds(tuple(part.token_ids.ids), where))
        elif kind == "text":
            out.append(Text(part.text, where))
        elif kind == "prompt_embeds":
            out.append(embeds_from_pb(part.prompt_embeds, where))
        else:
            raise InvalidArgument(f"{where}: prompt part has no kind; set token_ids, text or prompt_embeds")
    return out
