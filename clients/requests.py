"""Request building shared by the sync and async clients."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import grpc
import torch
from google.protobuf import struct_pb2

from clients.errors import SpliceClientError
from clients.parts import declared_embeds, to_message
from clients.types import Tokenized
from splice.errors import InvalidArgument, SpliceError
from splice.sampling import SamplingParams
from splice.structured_fields import FIELDS as STRUCTURED_FIELDS
from splice.structured_fields import structured_from_fields
from splice.tensor_chunks import tensor_chunks
from splice.v1 import common_pb2
from splice.v1 import preprocessor_pb2 as pp

R = TypeVar("R")

# Above this many bytes of tensors, a request goes as an Upload stream of bounded messages instead of one message.
UPLOAD_THRESHOLD = 4 << 20



def _client_errors(build: Callable[..., R]) -> Callable[..., R]:
    """What the server would refuse (an unsupported dtype...) or cannot be read here (an image path) is raised
    as SpliceClientError, the one exception type callers handle; TypeErrors stay programming errors."""

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> R:
        try:
            return build(*args, **kwargs)
        except SpliceError as exc:
            raise SpliceClientError(grpc.StatusCode[exc.code], exc.message) from None
        except OSError as exc:
            raise SpliceClientError(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"cannot read {exc.filename or 'a file'}: {exc.strerror or exc}") from None

    return wrapper


def _struct(value: dict) -> struct_pb2.Struct:
    pb = struct_pb2.Struct()
    pb.update(value)
    return pb


@_client_errors
def chat_request(messages: Iterable[Any], *, request_id: str = "", add_generation_prompt: bool | None = None,
                 chat_template: str | None = None, chat_template_kwargs: dict | None = None,
                 continue_final_message: bool = False, add_special_tokens: bool = False,
                 documents: Iterable[dict[str, str]] | None = None, reasoning_effort: str | None = None,
                 mm_processor_kwargs: dict | None = None, tools: Iterable[dict] | None = None,
                 tool_choice: str | dict | None = None, parallel_tool_calls: bool | None = None,
                 lora: str = "", deferred: list[torch.Tensor] | None = None, **sampling: Any) -> pp.ChatRequest:
    """The chat fields mean what vLLM's do (preprocessor.proto's ChatRequest); None leaves a field to the
    server's default. `sampling` takes SamplingParams' fields by vLLM's names: temperature, top_p, top_k, seed,
    max_tokens, stop, stop_token_ids, ignore_eos, logprobs, top_logprobs, skip_special_tokens, presence_penalty,
    frequency_penalty, repetition_penalty, min_p, min_tokens, logit_bias, allowed_token_ids, bad_words,
    include_stop_str_in_output, prompt_logprobs, logprob_token_ids, n, cache_salt; a structured output as
    `structured` (a StructuredOutput) or by vLLM's fields (response_format, structured_outputs, guided_json /
    guided_regex / guided_choice / guided_grammar).
    `tools`, `tool_choice`, `parallel_tool_calls`: OpenAI's (a chunk's tool_calls carry the calls found). `lora`:
    the LoRA adapter to answer with, by the name the server serves it as ("": the base model). With
    `deferred`, tensor parts are declared without their bytes and the tensors appended there (Upload)."""
    req = pp.ChatRequest(request_id=request_id, messages=[to_message(m, deferred) for m in messages],
                         sampling=_sampling(sampling), continue_final_message=continue_final_message,
                         add_special_tokens=add_special_tokens, lora_name=lora)
    if add_generation_prompt is not None:
        req.add_generation_prompt = add_generation_prompt
    if chat_template is not None:
        req.chat_template = chat_template
    if chat_template_kwargs:
        req.chat_template_kwargs.CopyFrom(_struct(chat_template_kwargs))
    if documents is not None:
        req.documents.extend(_struct(d) for d in documents)
    if reasoning_effort is not None:
        req.reasoning_effort = reasoning_effort
    if mm_processor_kwargs:
        req.mm_processor_kwargs.CopyFrom(_struct(mm_processor_kwargs))
    if tools is not None:
        req.tools.extend(_struct(t) for t in tools)
    if isinstance(tool_choice, dict):
        req.tool_choice.struct_value.update(tool_choice)
    elif tool_choice is not None:
        req.tool_choice.string_value = tool_choice
    if parallel_tool_calls is not None:
        req.parallel_tool_calls = parallel_tool_calls
    return req


@_client_errors
def complete_request(prompt: Iterable[Any], *, request_id: str = "", deferred: list[torch.Tensor] | None = None,
                     add_special_tokens: bool | None = None, lora: str = "", **sampling: Any) -> pp.CompleteRequest:
    """`prompt` items: list[int] (token IDs), str (text), torch.Tensor (prompt embeddings). `add_special_tokens`:
    a prompt starting with text gets the tokenizer's BOS there; None: the server's default (yes, as vLLM). `lora`:
    as chat_request's."""
    parts = []
    for item in prompt:
        if isinstance(item, str):
            parts.append(pp.PromptPart(text=item))
        elif isinstance(item, list | tuple):
            parts.append(pp.PromptPart(token_ids=pp.TokenIds(ids=[int(i) for i in item])))
        elif isinstance(item, pp.PromptPart):
            parts.append(item)
        elif isinstance(item, pp.PromptEmbeds):  # the torch_base64 / safetensors forms
            parts.append(pp.PromptPart(prompt_embeds=item))
        elif isinstance(item, pp.ContentPart) and item.WhichOneof("kind") == "prompt_embeds":
            parts.append(pp.PromptPart(prompt_embeds=item.prompt_embeds))
        elif isinstance(item, pp.ContentPart):
            raise TypeError(f"Complete takes token IDs, text and prompt embeddings, not a {item.WhichOneof('kind')} "
                            "part (images need Chat)")
        else:
            parts.append(pp.PromptPart(prompt_embeds=declared_embeds(item, deferred)))
    req = pp.CompleteRequest(request_id=request_id, prompt=parts, sampling=_sampling(sampling), lora_name=lora)
    if add_special_tokens is not None:
        req.add_special_tokens = add_special_tokens
    return req


def generation_call(build: Callable[..., pp.ChatRequest | pp.CompleteRequest], items: Iterable[Any],
                    **kwargs: Any) -> tuple[pp.ChatRequest | pp.CompleteRequest, list[torch.Tensor]]:
    """`build` (chat_request / complete_request) over `items`, and the tensors to stream after it: none when
    they fit under UPLOAD_THRESHOLD (then the request holds them and goes as one message)."""
    items = list(items)
    deferred: list[torch.Tensor] = []
    request = build(items, deferred=deferred, **kwargs)
    if deferred and sum(t.numel() * t.element_size() for t in deferred) <= UPLOAD_THRESHOLD:
        return build(items, **kwargs), []
    return request, deferred


def upload_parts(request: pp.ChatRequest | pp.CompleteRequest, tensors: list[torch.Tensor]) -> Iterator[pp.UploadPart]:
    """The Upload stream: the request (its streamed tensors declared, without bytes), then their chunks."""
    yield pp.UploadPart(chat=request) if isinstance(request, pp.ChatRequest) else pp.UploadPart(complete=request)
    for chunk in tensor_chunks(tensors):
        yield pp.UploadPart(chunk=chunk)


@_client_errors
def tokenize_request(messages: Iterable[Any] | None, *, text: str | None = None,
                     add_special_tokens: bool | None = None, **kwargs: Any) -> pp.TokenizeRequest:
    """`add_special_tokens`: None = the server's default (for `text`: yes, as Complete; for a chat: no, as Chat)."""
    if text is not None:
        req = pp.TokenizeRequest(text=text)
        if add_special_tokens is not None:
            req.add_special_tokens = add_special_tokens
        return req
    if add_special_tokens is not None:  # the conversation's own field (ChatRequest.add_special_tokens)
        kwargs["add_special_tokens"] = add_special_tokens
    return pp.TokenizeRequest(chat=chat_request(messages or [], **kwargs))


def tokenized_from_pb(pb: pp.TokenizeResponse) -> Tokenized:
    return Tokenized(tuple(pb.token_ids), tuple((s.offset, s.length) for s in pb.embed_spans), pb.prompt,
                     tuple(pb.image_token_counts))


def _sampling(sampling: dict) -> common_pb2.SamplingParams:
    """Validated here with the server's own rules, raised as the same SpliceClientError the server would give.
    vLLM's spellings are taken as its HTTP API takes them: `stop` as one string, `top_k` -1 for off."""
    asked = {name: sampling.pop(name) for name in STRUCTURED_FIELDS if name in sampling}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in sampling.items()}
    if isinstance(fields.get("stop"), str):
        fields["stop"] = (fields["stop"],)
    if fields.get("top_k") == -1:
        fields["top_k"] = 0
    try:
        found = structured_from_fields(asked)
        if found is not None:
            if fields.get("structured") is not None:
                raise InvalidArgument(f"only one kind of structured output constraint may be set, got structured, "
                                      f"{found[0]}")
            fields["structured"] = found[1]
        params = SamplingParams(**fields)
    except SpliceError as exc:
        raise SpliceClientError(grpc.StatusCode[exc.code], exc.message) from None
    return params.to_pb()
