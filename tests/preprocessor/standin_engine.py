"""A stand-in splice.v1.Engine for the preprocessor's link tests: reassembles each request with the
shared wire code and replays given token IDs. It is not the engine; it lets the preprocessor's side of
the link (wire encoding, cancellation, error mapping, reconnects) be exercised over real gRPC."""

from __future__ import annotations

import asyncio

import grpc

from engine.multiplex import Multiplexer
from splice.engine_wire import RequestAssembler
from splice.errors import InvalidArgument
from splice.model_info import ModelInfo
from splice.v1 import common_pb2, engine_pb2, engine_pb2_grpc


class StandinEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self, info: ModelInfo, reply_ids: list[int], forever: bool = False, delay: float = 0.0,
                 abort: str | None = None) -> None:
        self.info, self.reply_ids, self.forever, self.delay, self.abort = info, reply_ids, forever, delay, abort
        self.requests = []
        self.cancelled = asyncio.Event()  # set at each cancelled call, whose request ID joins cancelled_ids
        self.cancelled_ids: list[str] = []

    async def GetModelInfo(self, request, context):
        return self.info.to_pb()

    async def Generate(self, request_iterator, context):
        assembler = RequestAssembler()
        async for part in request_iterator:
            assembler.feed(part)
        async for response in self._reply(assembler, context):
            yield response

    async def GenerateWhole(self, request, context):
        assembler = RequestAssembler()
        for part in request.parts:
            assembler.feed(part)
        async for response in self._reply(assembler, context):
            yield response

    async def Multiplex(self, request_iterator, context):
        """The engine's own multiplexing (engine/multiplex.py) around this stand-in's GenerateWhole."""
        calls = Multiplexer(lambda request, flow: self.GenerateWhole(request, None))  # (reads nothing it is told)
        async for response in calls.serve(request_iterator):
            yield response

    async def _reply(self, assembler: RequestAssembler, context):
        request = assembler.finish()
        self.requests.append(request)
        if self.abort:
            if context is None:  # a Multiplex call: its error ends the call, not the stream
                raise InvalidArgument(self.abort)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.abort)
        try:
            i = 0
            sampling = request.sampling
            while self.forever or i < len(self.reply_ids):
                token = self.reply_ids[i % len(self.reply_ids)]
                # asked for logprobs: -0.5 for each token, and itself as its every alternative
                k = sampling.top_logprobs if sampling.logprobs else 0
                yield engine_pb2.GenerateResponse(token_ids=[token], logprobs=[-0.5] if sampling.logprobs else [],
                                                  top_token_ids=[token] * k, top_logprobs=[-0.5] * k)
                i += 1
                await asyncio.sleep(self.delay)
            yield engine_pb2.GenerateResponse(
                finish_reason=common_pb2.FINISH_REASON_LENGTH,
                usage=common_pb2.Usage(prompt_tokens=request.prompt_len, completion_tokens=i))
        except asyncio.CancelledError:
            self.cancelled_ids.append(request.request_id)
            self.cancelled.set()
            raise


async def start_standin(engine: StandinEngine, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    engine_pb2_grpc.add_EngineServicer_to_server(engine, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port
