"""The preprocessor core: Chat, Complete, Tokenize, Detokenize, GetModelInfo on plain dataclasses.

No grpc here. It is built from the model files and the engine's ModelInfo, so tests construct it
from a tiny model's config without an engine process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import aclosing

from preprocessor import metrics
from preprocessor.content import Conversation, Image, PromptPart, Text, TokenIds
from preprocessor.limits import Limits
from preprocessor.model_files import ModelFiles
from preprocessor.normalize import Normalized, normalize_chat, normalize_complete, tokenize_text
from preprocessor.outputs import GenerationChunk, TokenizeResult
from preprocessor.stream import EngineBackend, stream_generation
from preprocessor.template import RenderJob, check_template_policy, request_job
from preprocessor.template_sandbox import TemplateSandbox
from splice.errors import InvalidArgument
from splice.model_info import ModelInfo
from splice.request_rules import check_ids
from splice.sampling import SamplingParams

MAX_DETOKENIZE_IDS = 1 << 20
# A text-only request up to this many characters (token IDs count as characters) is normalized on the event
# loop: its template and tokenizer take less time than a thread's hand-off and return (~0.2 ms each way on two
# cores), and the template holds the GIL in a thread anyway. Anything larger, or with images or embeddings, goes
# to a thread, so that decoding and processing it never stalls the other streams.
INLINE_NORMALIZE_CHARS = 1024


def _inline(parts: Iterable[object], chars: int = 0) -> bool:
    """`parts` are text or token IDs only, `chars` and all of them within INLINE_NORMALIZE_CHARS."""
    for part in parts:
        if isinstance(part, Text):
            chars += len(part.text)
        elif isinstance(part, TokenIds):
            chars += len(part.ids)
        else:
            return False
        if chars > INLINE_NORMALIZE_CHARS:
            return False
    return True


class PreprocessorCore:
    def __init__(self, files: ModelFiles, info: ModelInfo, engine: EngineBackend | None = None,
                 limits: Limits | None = None, sandbox: TemplateSandbox | None = None) -> None:
        """`sandbox` renders request templates (when limits trust them); default: one of this core's own,
        started on first use and ended by close()."""
        self.files = files
        self.info = info
        self.limits = limits or Limits()
        self._engine = engine
        self._token_text: dict[int, str] = {}  # token_texts' cache
        self._own_sandbox = sandbox is None and self.limits.trust_request_chat_template
        self._sandbox = sandbox
        if self._own_sandbox:
            self._sandbox = TemplateSandbox(self.limits.chat_template_workers, self.limits.chat_template_timeout)

    def close(self) -> None:
        if self._own_sandbox and self._sandbox is not None:
            self._sandbox.close()

    def _render_request(self, job: RenderJob) -> str:
        if self._sandbox is None:
            raise RuntimeError("request templates are trusted but this core has no template sandbox")
        return self._sandbox.render(job)

    async def _prerendered(self, conv: Conversation) -> Callable[[RenderJob], str] | None:
        """A request template rendered on the sandbox before normalization takes a thread: waiting for a free
        worker then holds no thread that other requests need."""
        if conv.chat_template is None:
            return None
        check_template_policy(conv, self.limits.trust_request_chat_template, self.limits.max_chat_template_bytes)
        if self._sandbox is None:
            raise RuntimeError("request templates are trusted but this core has no template sandbox")
        f = self.files
        prompt = await self._sandbox.render_async(request_job(f.tokenizer, conv, f.image_placeholder, f.sentinels))
        return lambda job: prompt

    @staticmethod
    def _request_id(request_id: str) -> str:
        return request_id or uuid.uuid4().hex

    def normalize_chat(self, conv: Conversation, sampling: SamplingParams | None = None,
                       request_id: str = "", count_images: bool = False,
                       render_request: Callable[[RenderJob], str] | None = None) -> Normalized:
        return normalize_chat(conv, sampling or SamplingParams(), self._request_id(request_id), self.files,
                              self.info, self.limits, count_images, render_request or self._render_request)

    def normalize_complete(self, parts: Sequence[PromptPart], sampling: SamplingParams | None = None,
                           request_id: str = "") -> Normalized:
        return normalize_complete(parts, sampling or SamplingParams(), self._request_id(request_id), self.files,
                                  self.info, self.limits)

    async def chat(self, conv: Conversation, sampling: SamplingParams, request_id: str = "",
                   ) -> AsyncIterator[GenerationChunk]:
        arrival = time.perf_counter()
        # Normalized fully before the engine is contacted: every rejection happens here. In a thread unless it is
        # short text (INLINE_NORMALIZE_CHARS): image processing and tensor decoding would stall every other stream.
        rendered = await self._prerendered(conv)
        kwargs = len(str(conv.template_kwargs)) if conv.template_kwargs else 0  # (tools, documents: rendered too)
        if _inline((p for m in conv.messages for p in m.parts), kwargs):
            normalized = self.normalize_chat(conv, sampling, request_id, False, rendered)
        else:
            normalized = await asyncio.to_thread(self.normalize_chat, conv, sampling, request_id, False, rendered)
        _record("chat", normalized, arrival, len(conv.parts(Image)))
        # aclosing: closing this stream must close the inner ones now (down to the engine call), not at GC.
        async with aclosing(self._generate(normalized, "chat", arrival)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def complete(self, parts: Sequence[PromptPart], sampling: SamplingParams, request_id: str = "",
                       ) -> AsyncIterator[GenerationChunk]:
        arrival = time.perf_counter()
        if _inline(parts):
            normalized = self.normalize_complete(parts, sampling, request_id)
        else:
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

    async def tokenize_chat(self, conv: Conversation) -> TokenizeResult:
        rendered = await self._prerendered(conv)
        # In a thread, like Chat's normalization: images, embeds and long texts would stall every stream.
        n = await asyncio.to_thread(self.normalize_chat, conv, None, "", True, rendered)
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

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token's own text, special tokens included (as logprobs name them). Cached by ID, which the
        vocabulary bounds: top_logprobs ask for up to 20 texts per generated token."""
        out = []
        for t in ids:
            text = self._token_text.get(t)
            if text is None:
                text = self._token_text[t] = self.detokenize([t], skip_special_tokens=False)
            out.append(text)
        return out

    def model_info(self) -> ModelInfo:
        return self.info


def _record(endpoint: str, normalized: Normalized, arrival: float, images: int) -> None:
    request = normalized.request
    metrics.normalized(endpoint, time.perf_counter() - arrival, request.prompt_len, images, len(request.embed_spans))
