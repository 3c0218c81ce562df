"""splice.v1.Preprocessor servicer: decode pb (convert.py) -> one core call (answer.py for Chat and Complete) ->
encode pb (encode.py). Errors go to the call guard."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import grpc

from preprocessor import answer
from preprocessor.admission import Admission, Ticket
from preprocessor.answer import Asked
from preprocessor.content import Conversation
from preprocessor.convert import add_special_tokens_from_pb, conversation_from_pb, prompt_from_pb, tools_from_pb
from preprocessor.core import PreprocessorCore
from preprocessor.encode import chunk_pbs, tokenize_pb
from preprocessor.loras import LoraCatalog, not_served
from preprocessor.request_bounds import INLINE_REQUEST_BYTES, check_counts_only
from preprocessor.tools.choice import constrain, constraint_for
from preprocessor.tools.request import ToolRequest
from preprocessor.upload import UploadAssembler
from splice.errors import DeadlineExceeded, InvalidArgument
from splice.offload import inline_or_thread
from splice.request_rules import VOCABULARY_BOUNDED, check_control_counts
from splice.sampling import SamplingParams
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc


async def _next_part(parts: AsyncIterator[preprocessor_pb2.UploadPart], received: int, idle: float,
                     ) -> preprocessor_pb2.UploadPart | None:
    """The next Upload part, or None at the end; a stream silent for `idle` seconds fails, which releases what
    its call holds (its admission, its buffers)."""
    try:
        return await asyncio.wait_for(anext(parts, None), idle)
    except TimeoutError:
        raise DeadlineExceeded(f"the Upload stream sent nothing for {idle:g} s after {received} parts; it is "
                               f"abandoned (--upload-idle-timeout)") from None


def _conversation(core: PreprocessorCore, request: preprocessor_pb2.ChatRequest, streamed=None,
                  tools: ToolRequest | None = None) -> Conversation:
    """The request's conversation; its message and part counts checked first (request_bounds.py): converting 100k
    messages would take a second of its own."""
    parts = sum(len(m.content) or 1 for m in request.messages)
    check_counts_only(len(request.messages), parts, core.info)
    return conversation_from_pb(request, streamed, tools)


def _sampling(core: PreprocessorCore, pb: common_pb2.SamplingParams) -> SamplingParams:
    """SamplingParams of `pb`, its token-ID controls counted first (a map of 8M logit_bias entries would become 8M
    objects before any rule saw them)."""
    check_control_counts({name: len(getattr(pb, name)) for name in VOCABULARY_BOUNDED}, core.info)
    return SamplingParams.from_pb(pb)


def _chat(core: PreprocessorCore, request: preprocessor_pb2.ChatRequest,
          streamed=None) -> tuple[ToolRequest | None, Conversation, SamplingParams]:
    tools = tools_from_pb(request, core.limits.tools)
    conv = _conversation(core, request, streamed, tools)
    return tools, conv, constrain(_sampling(core, request.sampling), constraint_for(tools))


async def _decoded_chat(core: PreprocessorCore, request: preprocessor_pb2.ChatRequest,
                        streamed=None) -> tuple[ToolRequest | None, Conversation, SamplingParams]:
    """`request` converted and checked: in a thread unless it is small and has no tools (tools_from_pb and converting
    a long conversation grow with the request; the event loop serves every client)."""
    inline = not len(request.tools) and request.ByteSize() <= INLINE_REQUEST_BYTES
    return await inline_or_thread(inline, _chat, core, request, streamed)


class PreprocessorServicer(preprocessor_pb2_grpc.PreprocessorServicer):
    def __init__(self, core: Callable[[], PreprocessorCore], admission: Admission | None = None,
                 loras: LoraCatalog | None = None) -> None:
        # A getter, not the core: the engine link swaps the core when the engine (re)appears; it raises
        # Unavailable while there is none.
        self._core = core
        # Unary-request calls are admitted by the call guard; Upload here, by the size it declares.
        self._admission = admission or Admission()
        self._loras = loras  # the engine's LoRA adapters (None: none served)

    async def _lora(self, name: str) -> str:
        """A request's lora_name, checked before any of its work is done: NOT_FOUND for a name not served."""
        if not name:
            return ""
        if self._loras is None:
            raise not_served(name)
        return await self._loras.check(name)

    async def Chat(self, request: preprocessor_pb2.ChatRequest,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[preprocessor_pb2.GenerationChunk]:
        core = self._core()
        lora = await self._lora(request.lora_name)
        tools, conv, sampling = await _decoded_chat(core, request)
        # A client cancel cancels this task; the CancelledError closes the generators down to the engine call.
        async with aclosing(answer.chat(core, conv, sampling, Asked(request.request_id, lora, tools))) as events:
            async for event in events:
                for pb in chunk_pbs(event):
                    yield pb

    async def Complete(self, request: preprocessor_pb2.CompleteRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[preprocessor_pb2.GenerationChunk]:
        core = self._core()
        lora = await self._lora(request.lora_name)
        parts, sampling = await inline_or_thread(request.ByteSize() <= INLINE_REQUEST_BYTES, lambda: (
            prompt_from_pb(request), _sampling(core, request.sampling)))
        async with aclosing(answer.complete(core, parts, sampling, Asked(request.request_id, lora),
                                            add_special_tokens_from_pb(request))) as events:
            async for event in events:
                for pb in chunk_pbs(event):
                    yield pb

    async def Upload(self, request_iterator: AsyncIterator[preprocessor_pb2.UploadPart],
                     context: grpc.aio.ServicerContext) -> AsyncIterator[preprocessor_pb2.GenerationChunk]:
        core = self._core()
        tickets: list[Ticket] = []  # its admission, from when the first message declares its size
        upload = UploadAssembler(core.limits, admit=lambda nbytes: tickets.append(self._admission.stream(nbytes)))
        parts = aiter(request_iterator)
        try:
            # (a refusal reads the rest of the stream before it is sent: splice.call_guard)
            received = 0
            # (the limit read per part: it is the core's current one)
            while (part := await _next_part(parts, received, core.limits.upload_idle_timeout)) is not None:
                # It holds its bytes as they arrive (the buffers are committed as written), each part
                # before it is written; the request message once it admitted the upload.
                if tickets:
                    tickets[0].grow(part.ByteSize())
                upload.feed(part)
                if received == 0 and tickets:
                    tickets[0].grow(part.ByteSize())
                received += 1
            if tickets:
                tickets[0].place()
            request, streamed = upload.finish()
            lora = await self._lora(request.lora_name)
            if isinstance(request, preprocessor_pb2.ChatRequest):
                tools, conv, sampling = await _decoded_chat(core, request, streamed)
                events = answer.chat(core, conv, sampling, Asked(request.request_id, lora, tools))
            else:
                events = answer.complete(core, prompt_from_pb(request, streamed), _sampling(core, request.sampling),
                                         Asked(request.request_id, lora), add_special_tokens_from_pb(request))
            async with aclosing(events) as events:
                async for event in events:
                    for pb in chunk_pbs(event):
                        yield pb
        finally:
            for ticket in tickets:
                ticket.release()

    async def Tokenize(self, request: preprocessor_pb2.TokenizeRequest,
                       context: grpc.aio.ServicerContext) -> preprocessor_pb2.TokenizeResponse:
        core = self._core()
        kind = request.WhichOneof("input")
        if kind == "chat":
            conv = await asyncio.to_thread(_conversation, core, request.chat)
            return tokenize_pb(await core.tokenize_chat(conv))
        if kind == "text":  # in a thread: long texts would stall every stream
            result = await asyncio.to_thread(core.tokenize_text, request.text, add_special_tokens_from_pb(request))
            return tokenize_pb(result)
        raise InvalidArgument("TokenizeRequest has no input; set chat or text")

    async def Detokenize(self, request: preprocessor_pb2.DetokenizeRequest,
                         context: grpc.aio.ServicerContext) -> preprocessor_pb2.DetokenizeResponse:
        skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else True
        text = await asyncio.to_thread(self._core().detokenize, list(request.token_ids), skip)
        return preprocessor_pb2.DetokenizeResponse(text=text)

    async def GetModelInfo(self, request: common_pb2.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> common_pb2.ModelInfo:
        return self._core().model_info().to_pb()

