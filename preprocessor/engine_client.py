"""Async client of splice.v1.Engine: ModelInfo, and Generate as an async generator of EngineOutput (a request
that fits in one message goes on the Multiplex stream to one engine, or as GenerateWhole to replicas; a larger one
as the Generate stream).

Closing the generator (the Chat caller went away, or a stop string matched) cancels the engine call,
which aborts the sequence there.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from preprocessor.engine_multiplex import MultiplexedCalls
from preprocessor.engine_replicas import ReplicaFailure, call_every_replica, reset_every_replica
from splice.engine_output import EngineOutput
from splice.engine_request import EngineRequest
from splice.engine_wire import encode_header, encode_request, encode_whole
from splice.errors import SpliceError, Unavailable
from splice.grpc_options import replica_options
from splice.model_info import ModelInfo
from splice.prompt_logprobs import Pieces
from splice.security import ClientTLS, bearer, channel
from splice.tensor_chunks import paced
from splice.v1 import common_pb2, engine_pb2, engine_pb2_grpc

log = logging.getLogger(__name__)
ENGINE_SERVICE = engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name


class EngineError(SpliceError):
    """An error status from the engine, passed on with the engine's own code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def engine_error(code: str, details: str, target: str) -> SpliceError:
    """The engine's status `code` (a grpc.StatusCode name) for a call, as the preprocessor passes it on."""
    if code == "UNAVAILABLE":
        return Unavailable(f"engine at {target} is unavailable: {details}")
    return EngineError(code, f"engine: {details}")


def map_rpc_error(exc: grpc.aio.AioRpcError, target: str) -> SpliceError:
    return engine_error(exc.code().name, exc.details(), target)


def one_engine(target: str) -> bool:
    """Whether `target` names one engine (`host:port`), not replicas (a `dns:`, `ipv4:` or `ipv6:` target, which
    gRPC balances per call)."""
    return not target.startswith(("dns:", "ipv4:", "ipv6:"))


class EngineClient:
    def __init__(self, target: str, tls: ClientTLS | None = None, api_key: str | None = None,
                 multiplex: bool = True) -> None:
        """`target`: any gRPC target, one engine (`host:port`) or replicas (`dns:///engine:50061`,
        `ipv4:h1:p,h2:p`) balanced by their reported load; `tls`: reach the engine over TLS (with a client
        certificate for mTLS); `api_key`: the engine's key; `multiplex`: requests that fit in one message share one
        Multiplex stream to one engine (replicas keep one call per request, which gRPC balances)."""
        self.target = target
        self._tls = tls
        self._api_key = api_key
        # Tensor chunks keep each message small; responses are small too, so default limits suffice.
        options = replica_options(ENGINE_SERVICE, weighted=True, health_check=True)
        self._channel = channel(target, tls, options, aio=True)
        self._stub = engine_pb2_grpc.EngineStub(self._channel)
        self._metadata = bearer(api_key)
        self._multiplexed = MultiplexedCalls(self._stub, self._metadata,
                                             lambda code, details: engine_error(code, details, target)) \
            if multiplex and one_engine(target) else None

    async def get_model_info(self, timeout: float = 5.0) -> ModelInfo:
        try:
            pb = await self._stub.GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=timeout,
                                               metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise map_rpc_error(exc, self.target) from None
        return ModelInfo.from_pb(pb)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        header = encode_header(request)
        whole = encode_whole(request, header)
        if whole is not None and self._multiplexed is not None:  # one stream for many calls, one message a step
            answered = False
            try:
                async with aclosing(self._multiplexed.generate(whole)) as batches:
                    async for out in _outputs(batches, request.sampling.n):
                        answered = True
                        yield out
                return
            except EngineError as exc:  # an engine older than Multiplex: one call per request from now on
                if exc.code != "UNIMPLEMENTED" or answered:  # (never sent twice)
                    raise
                log.warning("the engine at %s has no Multiplex method (an older version): one call per request",
                            self.target)
                self._multiplexed = None
        if whole is not None:  # one message: no stream round trips before the engine can start
            call = self._stub.GenerateWhole(whole, metadata=self._metadata)
        else:
            call = self._stub.Generate(paced(encode_request(request, header=header)), metadata=self._metadata)
        try:
            async for out in _outputs(_one_by_one(call), request.sampling.n):
                yield out
        except grpc.aio.AioRpcError as exc:
            raise map_rpc_error(exc, self.target) from None
        finally:
            call.cancel()  # no-op when the call already ended

    async def lora_adapters(self, timeout: float = 5.0) -> tuple[bool, dict[str, str]]:
        """(whether the engine serves adapters, name -> folder of each) from one replica."""
        try:
            pb = await self._stub.ListLoraAdapters(engine_pb2.ListLoraAdaptersRequest(), timeout=timeout,
                                                   metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise map_rpc_error(exc, self.target) from None
        return pb.enabled, {a.name: a.path for a in pb.adapters}

    async def load_lora_adapter(self, name: str, path: str) -> tuple[list[str], list[ReplicaFailure]]:
        """LoadLoraAdapter on every replica behind the target: the addresses that serve it now, and those that
        failed."""
        return await call_every_replica(self.target, self._tls, self._api_key, "LoadLoraAdapter",
                                        engine_pb2.LoadLoraAdapterRequest(lora_name=name, lora_path=path))

    async def unload_lora_adapter(self, name: str) -> tuple[list[str], list[ReplicaFailure]]:
        return await call_every_replica(self.target, self._tls, self._api_key, "UnloadLoraAdapter",
                                        engine_pb2.UnloadLoraAdapterRequest(lora_name=name))

    async def reset_prefix_cache(self) -> tuple[list[str], list[ReplicaFailure]]:
        """ResetPrefixCache on every replica behind the target, each on its own channel (this one's balancing
        would reach one): the addresses reset, and those that failed."""
        return await reset_every_replica(self.target, self._tls, self._api_key)

    async def close(self) -> None:
        if self._multiplexed is not None:
            await self._multiplexed.close()
        await self._channel.close()


async def _one_by_one(call: AsyncIterator[engine_pb2.GenerateResponse],
                      ) -> AsyncIterator[list[engine_pb2.GenerateResponse]]:
    async for pb in call:
        yield [pb]


def _merged(outs: list[EngineOutput]) -> list[EngineOutput]:
    """Consecutive outputs of one choice as one, each finished output ending its run (a reader that fell behind
    gets fewer, larger outputs, as the engine's outbox merges them for a slow reader of a call of its own)."""
    runs: list[list[EngineOutput]] = []
    for out in outs:
        if runs and runs[-1][-1].index == out.index and not runs[-1][-1].finished:
            runs[-1].append(out)
        else:
            runs.append([out])
    return [EngineOutput.merge(run) for run in runs]


async def _outputs(batches: AsyncIterator[list[engine_pb2.GenerateResponse]], n: int) -> AsyncIterator[EngineOutput]:
    """A call's responses (in lists, as they arrived) as EngineOutputs: a long prompt's logprobs pieces joined,
    before the first token (of choice 0); consecutive outputs of a choice merged; `n` choices, each ending with its
    own finished output."""
    pieces = Pieces()
    unfinished = n
    async for pbs in batches:
        outs = []
        for pb in pbs:
            out = EngineOutput.from_pb(pb)
            if out.prompt_logprobs is not None:
                pieces.add(out.prompt_logprobs)
                if not out.token_ids and not out.finished:  # a leading piece alone
                    continue
                out = dataclasses.replace(out, prompt_logprobs=pieces.take())
            outs.append(out)
        for out in _merged(outs) if len(outs) > 1 else outs:
            unfinished -= out.finished
            if not unfinished:
                # The call is read to its end (the engine's handler returns right after its last message) before
                # the last output goes on: a consumer that stops there would otherwise cancel a call that succeeded,
                # and the engine would count it CANCELLED (a GenerateWhole call without its load report trailer).
                async for _ in batches:
                    pass
            yield out
