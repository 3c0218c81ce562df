"""splice.v1 preprocessor requests -> the core's content dataclasses. The only place that reads their protobuf;
replies are written by their own to_pb (outputs.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, struct_pb2

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
from preprocessor.template_args import template_arguments
from preprocessor.tools.request import (
    ToolRequest,
    ToolSettings,
    check_tool_count,
    checked_tools,
    message_fields,
    tool_request,
)
from splice.errors import InvalidArgument
from splice.v1 import preprocessor_pb2

Streamed = Mapping[Where, memoryview]  # bytes of tensors that came in an Upload stream, by part
MAX_EXACT_INT = 2**53  # a double holds every integer up to this exactly


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
    fields = message_fields([struct_from_pb(c) for c in pb.tool_calls],
                            pb.tool_call_id if pb.HasField("tool_call_id") else None,
                            pb.name if pb.HasField("name") else None, index)
    if pb.HasField("text"):
        if len(pb.content):
            raise InvalidArgument(f"messages[{index}]: set text or content, not both")
        return Message(pb.role, (Text(pb.text, Where(index, 0)),), True, index, fields)
    if not len(pb.content) and fields.get("tool_calls"):  # an assistant turn that is only calls (content null)
        return Message(pb.role, (Text("", Where(index, 0)),), True, index, fields)
    parts = tuple(part_from_pb(p, Where(index, i), streamed) for i, p in enumerate(pb.content))
    return Message(pb.role, parts, False, index, fields)


def _whole(value: Any) -> Any:
    """A Struct value as the same JSON parses on the HTTP face: protobuf's numbers are doubles, so a whole number
    becomes an int (a pixel count, a template's loop bound), anything else stays as it is."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_EXACT_INT:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


def struct_from_pb(pb: struct_pb2.Struct) -> dict[str, Any]:
    return _whole(json_format.MessageToDict(pb))


def conversation_from_pb(pb: preprocessor_pb2.ChatRequest, streamed: Streamed | None = None,
                         tools: ToolRequest | None = None) -> Conversation:
    """The same Conversation as the same request on the HTTP face (http/convert.conversation_from_http). `tools`: the
    request's, checked already (tools_from_pb); else they are checked here."""
    kwargs = struct_from_pb(pb.chat_template_kwargs) if pb.HasField("chat_template_kwargs") else None
    documents = [struct_from_pb(d) for d in pb.documents] if len(pb.documents) else None
    effort = pb.reasoning_effort if pb.HasField("reasoning_effort") else None
    return Conversation(
        messages=tuple(message_from_pb(m, i, streamed) for i, m in enumerate(pb.messages)),
        add_generation_prompt=pb.add_generation_prompt if pb.HasField("add_generation_prompt") else True,
        chat_template=pb.chat_template if pb.HasField("chat_template") else None,
        template_kwargs=template_arguments(kwargs, documents, effort,
                                           list(tools.tools) if tools is not None else checked_tools(_tools(pb))),
        continue_final_message=pb.continue_final_message,
        add_special_tokens=pb.add_special_tokens,
        mm_processor_kwargs=struct_from_pb(pb.mm_processor_kwargs) if pb.HasField("mm_processor_kwargs") else {},
    )


def _tools(pb: preprocessor_pb2.ChatRequest) -> list[dict[str, Any]]:
    check_tool_count(len(pb.tools))  # (before any is converted)
    return [struct_from_pb(t) for t in pb.tools]


def tools_from_pb(pb: preprocessor_pb2.ChatRequest, settings: ToolSettings) -> ToolRequest | None:
    """The same ToolRequest as the same request on the HTTP face (http/convert.tools_from_http)."""
    choice = _whole(json_format.MessageToDict(pb.tool_choice)) if pb.HasField("tool_choice") else None
    parallel = pb.parallel_tool_calls if pb.HasField("parallel_tool_calls") else None
    return tool_request(_tools(pb), choice, parallel, settings)


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
