"""splice.v1.Engine over gRPC: pb -> RequestAssembler -> LLMEngine.generate -> pb. Nothing else.

Errors are raised as SpliceError and mapped to status codes by splice.call_guard.CallGuard.
A cancelled call cancels this handler's task; leaving `engine.generate` aborts the sequence.
Generation starts as soon as the request is whole (its header and every tensor byte the header declared), not
at the stream's half-close, which comes in a later frame: the half-close (or a part too many, an error) is read
beside the generation.
GenerateWhole (the same parts in one message) is checked as that stream is, all at once.
Multiplex carries many GenerateWhole calls on one stream, a step's outputs in one message (engine/multiplex.py).
ResetPrefixCache forgets this replica's cached prefixes (the preprocessor calls every replica); ListLoraAdapters,
LoadLoraAdapter and UnloadLoraAdapter say, add and remove the LoRA adapters it serves.
Every Generate ends with the replica's load in its trailers (splice/load_report.py), which the
preprocessor's weighted round robin reads, and is refused when its model fingerprint is not this engine's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, contextmanager

import grpc

from engine.byte_budget import ByteBudget
from engine.flow import Flow
from engine.llm_engine import LLMEngine
from engine.metrics import PREFIX_CACHE_RESETS
from engine.multiplex import Multiplexer
from splice.call_guard import RpcMetrics
from splice.drain import Drain
from splice.engine_wire import RequestAssembler
from splice.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from splice.load_report import MIN_UTILIZATION, TRAILER, CallRate, encode_load_report
from splice.v1 import common_pb2, engine_pb2, engine_pb2_grpc

MULTIPLEX = "/splice.v1.Engine/Multiplex"


def _part_too_many(received: int, declared: int) -> InvalidArgument:
    return InvalidArgument(f"Generate stream part {received} arrived after the request was complete (its header and "
                           f"all {declared} declared tensor bytes); the stream must end there")


class _Upload:
    """One call's request as its parts arrive: the header first (its declared sizes are capped by the budget
    before any tensor byte arrives), then each tensor chunk held in the byte budget before it is written (the
    buffers are committed as written), so a silent stream holds nothing and cannot keep others out for free.
    Its `with` gives back what it holds."""

    def __init__(self, budget: ByteBudget, header: engine_pb2.GenerateRequestPart) -> None:
        self.budget = budget
        self.assembler = RequestAssembler(budget.limit)  # the budget is the cap: no other ceiling
        self.assembler.feed(header)
        self.received = 1  # parts fed, the header included
        self.held = 0

    def add(self, part: engine_pb2.GenerateRequestPart) -> None:
        """The next part; RESOURCE_EXHAUSTED when its bytes do not fit the budget now (the call guard reads the
        rest of a refused stream: a server that stops reading mid-stream makes the client see its own send
        failure, INTERNAL, instead)."""
        nbytes = len(part.chunk.data)
        if not self.budget.take(nbytes):
            raise self.budget.refusal(self.assembler.declared_bytes)
        self.held += nbytes
        self.assembler.feed(part)
        self.received += 1

    def __enter__(self) -> _Upload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.budget.give(self.held)


class EngineServicer(engine_pb2_grpc.EngineServicer):
    """`engine` may be set after the server starts; until then calls get UNAVAILABLE (health says so too)."""

    def __init__(self, engine: LLMEngine | None = None, budget: ByteBudget | None = None,
                 upload_idle_timeout: float = 30.0, replica: str = "engine", drain: Drain | None = None) -> None:
        self.engine = engine
        self.drain = drain  # a Multiplex stream refuses new calls once it drains, and ends when its calls are done
        self.budget = budget or ByteBudget(4 << 30)
        self.upload_idle_timeout = upload_idle_timeout
        self.replica = replica  # how this replica names itself in errors (address and host)
        self._rate = CallRate()
        self._call_metrics = RpcMetrics(MULTIPLEX)  # each multiplexed call, as the guard counts other calls
        self._in_flight = 0

    def _load_report(self) -> bytes:
        """Generate calls in flight (uploading, waiting or running, this one included) per running slot: 1.0 =
        every slot busy, more = a queue."""
        engine = self.engine
        if engine is None:
            return encode_load_report(1.0, 0.0)
        busy = self._in_flight / engine.cfg.max_running_seqs
        return encode_load_report(max(busy, MIN_UTILIZATION), self._rate.per_second())

    def _model_refusal(self, fingerprint: str, engine: LLMEngine) -> FailedPrecondition | None:
        info = engine.info
        if not fingerprint or fingerprint == info.fingerprint:
            return None
        return FailedPrecondition(
                f"engine replica {self.replica} serves {info.model!r} (model fingerprint {info.fingerprint}), "
                f"but the request was validated against model fingerprint {fingerprint}: the replicas behind "
                "this target serve different models")

    async def _next(self, parts: AsyncIterator[engine_pb2.GenerateRequestPart], received: int,
                    ) -> engine_pb2.GenerateRequestPart | None:
        """The next request part, or None at the end; a stream silent for upload_idle_timeout fails, which
        releases whatever budget its call holds (what it sent before it went silent)."""
        try:
            # a timeout scope, not wait_for: no extra task per part (a header-only request reads two "parts")
            async with asyncio.timeout(self.upload_idle_timeout):
                return await anext(parts, None)
        except TimeoutError:
            raise DeadlineExceeded(f"the Generate stream sent nothing for {self.upload_idle_timeout:g} s after "
                                   f"{received} parts; its upload is abandoned (--upload-idle-timeout)") from None

    @staticmethod
    async def _end_of(parts: AsyncIterator[engine_pb2.GenerateRequestPart], received: int, declared: int) -> None:
        """The request is whole: the next thing on its stream must be the end. Not timed: the call's generation
        bounds how long this waits."""
        if await anext(parts, None) is not None:
            raise _part_too_many(received, declared)

    def _ready(self) -> LLMEngine:
        if self.engine is None:
            raise Unavailable("engine is loading; watch grpc.health.v1 for SERVING")
        return self.engine

    @contextmanager
    def _counted(self, context: grpc.aio.ServicerContext | None) -> Iterator[None]:
        """One Generate / GenerateWhole call in flight: counted in the load report, which ends it in its trailers
        (`context`; None: a Multiplex call, whose stream has no trailers of its own)."""
        self._in_flight += 1
        try:
            yield
        finally:
            if context is not None:
                context.set_trailing_metadata(((TRAILER, self._load_report()),))
            self._in_flight -= 1
            self._rate.finished()

    async def Generate(self, request_iterator: AsyncIterator[engine_pb2.GenerateRequestPart],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[engine_pb2.GenerateResponse]:
        engine = self._ready()
        with self._counted(context):
            async for out in self._generate(engine, request_iterator):
                yield out

    async def GenerateWhole(self, request: engine_pb2.GenerateRequest,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[engine_pb2.GenerateResponse]:
        """Generate's parts in one message, with the stream's checks, budget, errors and trailers: the same
        checks, in the same order, with the same messages. Every part is here already: no per-part reads,
        timeouts or end-of-stream watcher, so the engine is reached sooner."""
        engine = self._ready()
        with self._counted(context):
            async for pb in self._whole(engine, request):
                yield pb

    async def Multiplex(self, request_iterator: AsyncIterator[engine_pb2.MultiplexRequest],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[engine_pb2.MultiplexResponse]:
        """Many GenerateWhole calls on one stream, a step's outputs in one message (engine/multiplex.py). Each
        call counts in the load report as a GenerateWhole call does; the stream carries no trailer of its own."""
        engine = self._ready()
        drain = self.drain
        calls = Multiplexer(lambda request, flow: self._multiplexed(engine, request, flow),
                            (lambda: drain.draining) if drain is not None else (lambda: False), self._call_metrics)
        if drain is not None:
            drain.watch(calls.wake)
        try:
            async for response in calls.serve(request_iterator):
                yield response
        finally:
            if drain is not None:
                drain.unwatch(calls.wake)

    async def _multiplexed(self, engine: LLMEngine, request: engine_pb2.GenerateRequest, flow: Flow | None,
                           ) -> AsyncIterator[engine_pb2.GenerateResponse]:
        with self._counted(None):
            async with aclosing(self._whole(engine, request, flow)) as outputs:
                async for pb in outputs:
                    yield pb

    async def _whole(self, engine: LLMEngine, request: engine_pb2.GenerateRequest, flow: Flow | None = None,
                     ) -> AsyncIterator[engine_pb2.GenerateResponse]:
        """`flow`: its reader's acknowledgements over Multiplex (engine/flow.py); None: what is sent counts as read,
        and gRPC's flow control holds the writer back while the client does not read."""
        parts = request.parts
        with self._upload(engine, parts[0] if parts else None) as upload:
            while not upload.assembler.complete and upload.received < len(parts):
                upload.add(parts[upload.received])
            engine_request = upload.assembler.finish()  # raises if the parts ended short of the declared bytes
            if upload.received < len(parts):
                raise _part_too_many(upload.received, upload.assembler.declared_bytes)
            async with aclosing(engine.generate(engine_request, flow)) as outputs:
                async for out in outputs:
                    for pb in out.to_pbs():
                        yield pb

    def _upload(self, engine: LLMEngine, first: engine_pb2.GenerateRequestPart | None) -> _Upload:
        """A request's upload from its first part, which must be a header for this engine's model (a stream
        refused here or later is read to its end by the call guard before the refusal is sent)."""
        if first is None:
            raise InvalidArgument("Generate stream is empty; a header comes first")
        upload = _Upload(self.budget, first)
        refusal = self._model_refusal(first.header.model_fingerprint, engine)
        if refusal is not None:
            raise refusal
        return upload

    async def _generate(self, engine: LLMEngine, request_iterator: AsyncIterator[engine_pb2.GenerateRequestPart],
                        ) -> AsyncIterator[engine_pb2.GenerateResponse]:
        parts = aiter(request_iterator)
        with self._upload(engine, await self._next(parts, 0)) as upload:
            # Until the request is whole (header + every declared tensor byte), not until the stream's half-close:
            # that arrives in a later frame, and waiting for it would delay every first token.
            assembler = upload.assembler
            while not assembler.complete and (part := await self._next(parts, upload.received)) is not None:
                upload.add(part)
            request = assembler.finish()  # raises if the stream ended short of the declared bytes
            # The stream must end now; its end (or a part too many) is read beside the generation.
            end = asyncio.ensure_future(self._end_of(parts, upload.received, assembler.declared_bytes))
            try:
                async with aclosing(engine.generate(request)) as outputs:
                    async for out in outputs:
                        if end.done():  # a part after the request was whole: INVALID_ARGUMENT, the sequence aborts
                            end.result()
                        for pb in out.to_pbs():
                            yield pb
                if end.done():
                    end.result()
            finally:
                if not end.cancel() and not end.cancelled():
                    end.exception()  # ended after the last check: its error came too late to matter (retrieved)

    async def GetModelInfo(self, request: common_pb2.GetModelInfoRequest,
                           context: grpc.aio.ServicerContext) -> common_pb2.ModelInfo:
        return self._ready().info.to_pb()

    async def ResetPrefixCache(self, request: engine_pb2.ResetPrefixCacheRequest,
                               context: grpc.aio.ServicerContext) -> engine_pb2.ResetPrefixCacheResponse:
        engine = self._ready()
        await engine.reset_prefix_cache()  # (done by the engine thread at its next step boundary)
        PREFIX_CACHE_RESETS.inc()
        return engine_pb2.ResetPrefixCacheResponse()

    async def ListLoraAdapters(self, request: engine_pb2.ListLoraAdaptersRequest,
                               context: grpc.aio.ServicerContext) -> engine_pb2.ListLoraAdaptersResponse:
        engine = self._ready()
        return engine_pb2.ListLoraAdaptersResponse(
            adapters=[engine_pb2.LoraAdapter(name=n, path=p) for n, p in engine.loras.served.items()],
            enabled=engine.loras.enabled)

    async def LoadLoraAdapter(self, request: engine_pb2.LoadLoraAdapterRequest,
                              context: grpc.aio.ServicerContext) -> engine_pb2.LoadLoraAdapterResponse:
        await self._ready().loras.load(request.lora_name, request.lora_path)
        return engine_pb2.LoadLoraAdapterResponse()

    async def UnloadLoraAdapter(self, request: engine_pb2.UnloadLoraAdapterRequest,
                                context: grpc.aio.ServicerContext) -> engine_pb2.UnloadLoraAdapterResponse:
        self._ready().loras.unload(request.lora_name)
        return engine_pb2.UnloadLoraAdapterResponse()
