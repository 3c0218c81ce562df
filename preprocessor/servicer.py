"""splice.v1.Preprocessor servicer: decode pb -> one core call -> encode pb. Errors go to the interceptor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import grpc

from preprocessor.convert import conversation_from_pb, prompt_from_pb
from preprocessor.core import PreprocessorCore
from preprocessor.upload import UploadAssembler
from splice.errors import InvalidArgument, SpliceError
from splice.sampling import SamplingParams
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc


class PreprocessorServicer(preprocessor_pb2_grpc.PreprocessorServicer):
    def __init__(self, core: Callable[[], PreprocessorCore]) -> None:
        # A getter, not the core: the engine link swaps the core when the engine (re)appears; it raises
        # Unavailable while there is none.
        self._core = core

    async def Chat(self, request: preprocessor_pb2.ChatRequest,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[preprocessor_pb2.GenerationChunk]:
        core = self._core()
        conv = conversation_from_pb(request)
        sampling = SamplingParams.from_pb(request.sampling)
        # A client cancel cancels this task; the CancelledError closes the generators down to the engine call.
        async with aclosing(core.chat(conv, sampling, request.request_id)) as chunks:
            async for chunk in chunks:
                yield chunk.to_pb()

    async def Complete(self, request: preprocessor_pb2.CompleteRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[preprocessor_pb2.GenerationChunk]:
        core = self._core()
        parts = prompt_from_pb(request)
        sampling = SamplingParams.from_pb(request.sampling)
        async with aclosing(core.complete(parts, sampling, request.request_id)) as chunks:
            async for chunk in chunks:
                yield chunk.to_pb()

    async def Upload(self, request_iterator: AsyncIterator[preprocessor_pb2.UploadPart],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[preprocessor_pb2.GenerationChunk]:
        core = self._core()
        upload = UploadAssembler(core.limits)
        parts = aiter(request_iterator)
        try:
            async for part in parts:
                upload.feed(part)
        except SpliceError:
            # Read and drop the rest: a server that stops reading mid-stream makes the client see its own send
            # failure (INTERNAL) instead of this status.
            async for _ in parts:
                pass
            raise
        request, streamed = upload.finish()
        sampling = SamplingParams.from_pb(request.sampling)
        if isinstance(request, preprocessor_pb2.ChatRequest):
            chunks = core.chat(conversation_from_pb(request, streamed), sampling, request.request_id)
        else:
            chunks = core.complete(prompt_from_pb(request, streamed), sampling, request.request_id)
        async with aclosing(chunks) as chunks:
            async for chunk in chunks:
                yield chunk.to_pb()

    async def Tokenize(self, request: preprocessor_pb2.TokenizeRequest,
                       context: grpc.aio.ServicerContext) -> preprocessor_pb2.TokenizeResponse:
        core = self._core()
        kind = request.WhichOneof("input")
        if kind == "chat":
            return (await core.tokenize_chat(conversation_from_pb(request.chat))).to_pb()
        if kind == "text":  # in a thread: long texts would stall every stream
            result = await asyncio.to_thread(core.tokenize_text, request.text, request.add_special_tokens)
            return result.to_pb()
        raise InvalidArgument("TokenizeRequest has no input; set chat or text")

    async def Detokenize(self, request: preprocessor_pb2.DetokenizeRequest,
                         context: grpc.aio.ServicerContext) -> preprocessor_pb2.DetokenizeResponse:
        skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else True
        text = await asyncio.to_thread(self._core().detokenize, list(request.token_ids), skip)
        return preprocessor_pb2.DetokenizeResponse(text=text)

    async def GetModelInfo(self, request: common_pb2.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> common_pb2.ModelInfo:
        return self._core().model_info().to_pb()
