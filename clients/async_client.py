"""asyncio client: `async with AsyncSpliceClient(target) as c: async for chunk in c.chat([...]): ...`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
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
from clients.sync_client import CHANNEL_OPTIONS
from clients.types import Chunk, ChunkReader, Tokenized
from splice.model_info import ModelInfo
from splice.security import ClientTLS, bearer, channel
from splice.tensor_chunks import paced
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc


class AsyncSpliceClient:
    def __init__(self, target: str, timeout: float | None = None, *, tls: ClientTLS | None = None,
                 api_key: str | None = None) -> None:
        """As SpliceClient."""
        self._channel = channel(target, tls, CHANNEL_OPTIONS, aio=True)
        self._metadata = bearer(api_key)
        self._stub = preprocessor_pb2_grpc.PreprocessorStub(self._channel)
        self._timeout = timeout

    async def __aenter__(self) -> AsyncSpliceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        import asyncio

        await asyncio.wait_for(self._channel.channel_ready(), timeout)

    def chat(self, messages: Iterable[Any], **kwargs: Any) -> AsyncIterator[Chunk]:
        return self._generate(self._stub.Chat, chat_request, messages, **kwargs)

    def complete(self, prompt: Iterable[Any], **kwargs: Any) -> AsyncIterator[Chunk]:
        return self._generate(self._stub.Complete, complete_request, prompt, **kwargs)

    async def tokenize(self, messages: Iterable[Any] | None = None, *, text: str | None = None,
                       add_special_tokens: bool | None = None, **kwargs: Any) -> Tokenized:
        req = tokenize_request(messages, text=text, add_special_tokens=add_special_tokens, **kwargs)
        return tokenized_from_pb(await self._unary(self._stub.Tokenize, req))

    async def detokenize(self, token_ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        req = preprocessor_pb2.DetokenizeRequest(token_ids=list(token_ids), skip_special_tokens=skip_special_tokens)
        return (await self._unary(self._stub.Detokenize, req)).text

    async def model_info(self) -> ModelInfo:
        return ModelInfo.from_pb(await self._unary(self._stub.GetModelInfo, common_pb2.GetModelInfoRequest()))

    async def _unary(self, method, request):
        try:
            return await method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise SpliceClientError.from_rpc_error(err) from None

    def _generate(self, method, build, items, **kwargs: Any) -> AsyncIterator[Chunk]:
        """As one message, or as an Upload stream when its tensors are larger than UPLOAD_THRESHOLD."""
        request, tensors = generation_call(build, items, **kwargs)
        if tensors:
            return self._stream(self._stub.Upload, paced(upload_parts(request, tensors)))
        return self._stream(method, request)

    async def _stream(self, method, request) -> AsyncIterator[Chunk]:
        call = method(request, timeout=self._timeout, metadata=self._metadata)
        reader = ChunkReader()
        try:
            async for pb in call:
                if (chunk := reader.read(pb)) is not None:
                    yield chunk
        except grpc.RpcError as err:
            raise SpliceClientError.from_rpc_error(err) from None
        finally:
            call.cancel()
