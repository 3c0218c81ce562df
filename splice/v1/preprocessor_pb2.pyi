from google.protobuf import struct_pb2 as _struct_pb2
from splice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImageInput(_message.Message):
    __slots__ = ("data", "url", "path")
    DATA_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    url: str
    path: str
    def __init__(self, data: _Optional[bytes] = ..., url: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class PromptEmbeds(_message.Message):
    __slots__ = ("tensor", "torch_base64", "safetensors")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    TORCH_BASE64_FIELD_NUMBER: _ClassVar[int]
    SAFETENSORS_FIELD_NUMBER: _ClassVar[int]
    tensor: _common_pb2.Tensor
    torch_base64: str
    safetensors: bytes
    def __init__(self, tensor: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., torch_base64: _Optional[str] = ..., safetensors: _Optional[bytes] = ...) -> None: ...

class Integers(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, values: _Optional[_Iterable[int]] = ...) -> None: ...

class ImageEmbeds(_message.Message):
    __slots__ = ("embeds", "geometry")
    class GeometryEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Integers
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Integers, _Mapping]] = ...) -> None: ...
    EMBEDS_FIELD_NUMBER: _ClassVar[int]
    GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    embeds: PromptEmbeds
    geometry: _containers.MessageMap[str, Integers]
    def __init__(self, embeds: _Optional[_Union[PromptEmbeds, _Mapping]] = ..., geometry: _Optional[_Mapping[str, Integers]] = ...) -> None: ...

class ContentPart(_message.Message):
    __slots__ = ("text", "image", "prompt_embeds", "image_embeds")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_EMBEDS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_EMBEDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    image: ImageInput
    prompt_embeds: PromptEmbeds
    image_embeds: ImageEmbeds
    def __init__(self, text: _Optional[str] = ..., image: _Optional[_Union[ImageInput, _Mapping]] = ..., prompt_embeds: _Optional[_Union[PromptEmbeds, _Mapping]] = ..., image_embeds: _Optional[_Union[ImageEmbeds, _Mapping]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "text", "tool_calls", "tool_call_id", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: _containers.RepeatedCompositeFieldContainer[ContentPart]
    text: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    tool_call_id: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ..., text: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ChatRequest(_message.Message):
    __slots__ = ("request_id", "messages", "sampling", "add_generation_prompt", "chat_template", "chat_template_kwargs", "continue_final_message", "add_special_tokens", "documents", "reasoning_effort", "mm_processor_kwargs", "tools", "tool_choice", "parallel_tool_calls", "lora_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    REASONING_EFFORT_FIELD_NUMBER: _ClassVar[int]
    MM_PROCESSOR_KWARGS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    sampling: _common_pb2.SamplingParams
    add_generation_prompt: bool
    chat_template: str
    chat_template_kwargs: _struct_pb2.Struct
    continue_final_message: bool
    add_special_tokens: bool
    documents: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    reasoning_effort: str
    mm_processor_kwargs: _struct_pb2.Struct
    tools: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    tool_choice: _struct_pb2.Value
    parallel_tool_calls: bool
    lora_name: str
    def __init__(self, request_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., add_generation_prompt: _Optional[bool] = ..., chat_template: _Optional[str] = ..., chat_template_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., continue_final_message: _Optional[bool] = ..., add_special_tokens: _Optional[bool] = ..., documents: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., reasoning_effort: _Optional[str] = ..., mm_processor_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., tool_choice: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., lora_name: _Optional[str] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PromptPart(_message.Message):
    __slots__ = ("token_ids", "text", "prompt_embeds")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_EMBEDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: TokenIds
    text: str
    prompt_embeds: PromptEmbeds
    def __init__(self, token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., text: _Optional[str] = ..., prompt_embeds: _Optional[_Union[PromptEmbeds, _Mapping]] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "sampling", "add_special_tokens", "lora_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: _containers.RepeatedCompositeFieldContainer[PromptPart]
    sampling: _common_pb2.SamplingParams
    add_special_tokens: bool
    lora_name: str
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[_Iterable[_Union[PromptPart, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., add_special_tokens: _Optional[bool] = ..., lora_name: _Optional[str] = ...) -> None: ...

class UploadPart(_message.Message):
    __slots__ = ("chat", "complete", "chunk")
    CHAT_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    chat: ChatRequest
    complete: CompleteRequest
    chunk: _common_pb2.TensorChunk
    def __init__(self, chat: _Optional[_Union[ChatRequest, _Mapping]] = ..., complete: _Optional[_Union[CompleteRequest, _Mapping]] = ..., chunk: _Optional[_Union[_common_pb2.TensorChunk, _Mapping]] = ...) -> None: ...

class GenerationChunk(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs", "finish_reason", "usage", "stop_reason", "top_token_ids", "top_logprobs", "prompt_logprobs", "index", "tool_calls", "stop_token_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: _common_pb2.FinishReason
    usage: _common_pb2.Usage
    stop_reason: str
    top_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    prompt_logprobs: _common_pb2.PromptLogprobs
    index: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    stop_token_id: int
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., stop_reason: _Optional[str] = ..., top_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ..., prompt_logprobs: _Optional[_Union[_common_pb2.PromptLogprobs, _Mapping]] = ..., index: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ..., stop_token_id: _Optional[int] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("chat", "text", "add_special_tokens")
    CHAT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    chat: ChatRequest
    text: str
    add_special_tokens: bool
    def __init__(self, chat: _Optional[_Union[ChatRequest, _Mapping]] = ..., text: _Optional[str] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "embed_spans", "prompt", "image_token_counts")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EMBED_SPANS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    embed_spans: _containers.RepeatedCompositeFieldContainer[_common_pb2.EmbedSpan]
    prompt: str
    image_token_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., embed_spans: _Optional[_Iterable[_Union[_common_pb2.EmbedSpan, _Mapping]]] = ..., prompt: _Optional[str] = ..., image_token_counts: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("token_ids", "skip_special_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    skip_special_tokens: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., skip_special_tokens: _Optional[bool] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...
