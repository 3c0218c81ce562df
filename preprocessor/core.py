"""The preprocessor core: Chat, Complete, Tokenize, Detokenize, GetModelInfo on plain dataclasses.

No grpc here. It is built from the model files and the engine's ModelInfo, so tests construct it
from a tiny model's config without an engine process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing

from preprocessor import metrics
from preprocessor.content import Conversation, Image, PromptPart
from preprocessor.limits import Limits
from preprocessor.model_files import ModelFiles
from preprocessor.normalize import Normalized, normalize_chat, normalize_complete, tokenize_text
from preprocessor.outputs import GenerationChunk, TokenizeResult
from preprocessor.stream import EngineBackend, stream_generation
from splice.errors import InvalidArgument
from splice.model_info import ModelInfo
from splice.request_rules import check_ids
from splice.sampling import SamplingParams

MAX_DETOKENIZE_IDS = 1 << 20


class PreprocessorCore:
    def __init__(self, files: ModelFiles, info: ModelInfo, engine: EngineBackend | None = None,
                 limits: Limits | None = None) -> None:
        self.files = files
        self.info = info
        self.limits = limits or Limits()
        self._engine = engine

    @staticmethod
    def _request_id(request_id: str) -> str:
        return request_id or uuid.uuid4().hex

    def normalize_chat(self, conv: Conversation, sampling: SamplingParams | None = None,
                       request_id: str = "", count_images: bool = False) -> Normalized:
        return normalize_chat(conv, sampling or SamplingParams(), self._request_id(request_id), self.files,
                              self.info, self.limits, count_images)

    def normalize_complete(self, parts: Sequence[PromptPart], sampling: SamplingParams | None = None,
                           request_id: str = "") -> Normalized:
        return normalize_complete(parts, sampling or SamplingParams(), self._request_id(request_id), self.files,
                                  self.info, self.limits)

    async def chat(self, conv: Conversation, sampling: SamplingParams, request_id: str = "",
                   ) -> AsyncIterator[GenerationChunk]:
        arrival = time.perf_counter()
        # Normalized fully before the engine is contacted: every rejection happens here. In a thread:
        # image processing and tensor decoding would otherwise stall every other stream on this loop.
        normalized = await asyncio.to_thread(self.normalize_chat, conv, sampling, request_id)
        _record("chat", normalized, arrival, len(conv.parts(Image)))
        # aclosing: closing this stream must close the inner ones now (down to the engine call), not at GC.
        async with aclosing(self._generate(normalized, "chat", arrival)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def complete(self, parts: Sequence[PromptPart], sampling: SamplingParams, request_id: str = "",
                       ) -> AsyncIterator[GenerationChunk]:
        arrival = time.perf_counter()
        normalized = await asyncio.to_thread(self.normalize_complete, parts, sampling, request_id)
        _record("complete", normalized, arrival, 0)
        async with aclosing(self._generate(normalized, "complete", arrival)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _generate(self, normalized: Normalized, endpoint: str, arrival: float) -> AsyncIterator[GenerationChunk]:
        if self._engine is None:
            raise RuntimeError("this PreprocessorCore has no engine")
        first = True
        stream = stream_generation(normalized.request, self._engine, self.files.tokenizer, self.files.sentinels.id_set)
        async with aclosing(stream) as chunks:
            async for chunk in chunks:
                if first:
                    metrics.TTFT_SECONDS.labels(endpoint).observe(time.perf_counter() - arrival)
                    first = False
                if chunk.final:
                    metrics.E2E_SECONDS.labels(endpoint).observe(time.perf_counter() - arrival)
                yield chunk

    def tokenize_chat(self, conv: Conversation) -> TokenizeResult:
        n = self.normalize_chat(conv, count_images=True)
        return TokenizeResult(tuple(n.request.token_ids),
                              tuple((s.offset, s.length, s.tensor_index) for s in n.request.embed_spans),
                              n.prompt, n.image_token_counts)

    def tokenize_text(self, text: str, add_special_tokens: bool = False) -> TokenizeResult:
        ids = tokenize_text(text, add_special_tokens, self.files, self.info)
        return TokenizeResult(tuple(ids), (), text, ())

    def detokenize(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if len(ids) > MAX_DETOKENIZE_IDS:
            raise InvalidArgument(f"{len(ids)} token IDs; at most {MAX_DETOKENIZE_IDS}")
        check_ids(ids, self.info)
        # Sentinel IDs can be valid engine IDs (padded tables) but never decode to the internal sentinel text.
        return self.files.tokenizer.decode(self.files.sentinels.drop(ids), skip_special_tokens=skip_special_tokens,
                                           clean_up_tokenization_spaces=False)

    def model_info(self) -> ModelInfo:
        return self.info


def _record(endpoint: str, normalized: Normalized, arrival: float, images: int) -> None:
    request = normalized.request
    metrics.normalized(endpoint, time.perf_counter() - arrival, request.prompt_len, images, len(request.embed_spans))
