"""Blocking client: `with SpliceClient("127.0.0.1:50051") as c: for chunk in c.chat([...]): ...`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from clients.errors import SpliceClientError
from clients.requests import (
    chat_request,
    complete_request,
    generation_call,
    tokenize_request,
    tokenized_from_pb,
    upload_parts,
)
from clients.types import Chunk, ChunkReader, Tokenized
from splice.grpc_options import replica_options
from splice.model_info import ModelInfo
from splice.security import ClientTLS, bearer, channel
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc

# Prompt embeddings and images make requests larger than gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 512 << 20  # as the preprocessor accepts
# A target may name several preprocessors (`dns:///splice:50051`, `ipv4:h1:p,h2:p`): calls go round robin,
# and one refused UNAVAILABLE (a draining replica) before any answer is retried on another.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   *replica_options(preprocessor_pb2.DESCRIPTOR.services_by_name["Preprocessor"].full_name)]


class SpliceClient:
    def __init__(self, target: str, timeout: float | None = None, *, tls: ClientTLS | None = None,
                 api_key: str | None = None) -> None:
        """`tls`: connect over TLS (ClientTLS(ca=..., cert=..., key=...) for mTLS); `api_key`: the server's
        --api-key, sent as `authorization: Bearer` metadata on every call."""
        self._channel = channel(target, tls, CHANNEL_OPTIONS)
        self._metadata = bearer(api_key)
        self._stub = preprocessor_pb2_grpc.PreprocessorStub(self._channel)
        self._timeout = timeout

    def __enter__(self) -> SpliceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def chat(self, messages: Iterable[Any], **kwargs: Any) -> Iterator[Chunk]:
        """Streams the answer; closing the iterator early cancels the call (and the engine's sequence)."""
        return self._generate(self._stub.Chat, chat_request, messages, **kwargs)

    def complete(self, prompt: Iterable[Any], **kwargs: Any) -> Iterator[Chunk]:
        return self._generate(self._stub.Complete, complete_request, prompt, **kwargs)

    def tokenize(self, messages: Iterable[Any] | None = None, *, text: str | None = None,
                 add_special_tokens: bool | None = None, **kwargs: Any) -> Tokenized:
        req = tokenize_request(messages, text=text, add_special_tokens=add_special_tokens, **kwargs)
        return tokenized_from_pb(self._unary(self._stub.Tokenize, req))

    def detokenize(self, token_ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        req = preprocessor_pb2.DetokenizeRequest(token_ids=list(token_ids), skip_special_tokens=skip_special_tokens)
        return self._unary(self._stub.Detokenize, req).text

    def model_info(self) -> ModelInfo:
        return ModelInfo.from_pb(self._unary(self._stub.GetModelInfo, common_pb2.GetModelInfoRequest()))

    def _unary(self, method, request):
        try:
            return method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise SpliceClientError.from_rpc_error(err) from None

    def _generate(self, method, build, items, **kwargs: Any) -> Iterator[Chunk]:
        """As one message, or as an Upload stream when its tensors are larger than UPLOAD_THRESHOLD."""
        request, tensors = generation_call(build, items, **kwargs)
        if tensors:
            return self._stream(self._stub.Upload, upload_parts(request, tensors))
        return self._stream(method, request)

    def _stream(self, method, request) -> Iterator[Chunk]:
        call = method(request, timeout=self._timeout, metadata=self._metadata)
        reader = ChunkReader()
        try:
            for pb in call:
                if (chunk := reader.read(pb)) is not None:
                    yield chunk
        except grpc.RpcError as err:
            raise SpliceClientError.from_rpc_error(err) from None
        finally:
            call.cancel()  # no-op once finished; frees the engine slot when the caller stops early
