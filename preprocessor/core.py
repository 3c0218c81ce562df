"""The preprocessor core: a request prepared for the engine (normalized, every refusal made) and its choices'
streams from the engine (generate); Tokenize, Detokenize and GetModelInfo. answer.py makes a request's answer of
these, for both faces.

No grpc and no JSON here. It is built from the model files and the engine's ModelInfo, so tests construct it
from a tiny model's config without an engine process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from preprocessor import metrics
from preprocessor.content import Conversation, Embeds, PromptPart, Text, TokenIds
from preprocessor.detokenizer import decoder
from preprocessor.limits import Limits
from preprocessor.merge import merge_streams
from preprocessor.model_files import ModelFiles
from preprocessor.normalize import Normalized, normalize_chat, normalize_complete, tokenize_text
from preprocessor.outputs import GenerationChunk, TokenizeResult
from preprocessor.request_bounds import check_conversation, check_prompt, check_text
from preprocessor.stream import EngineBackend, EosIds, stream_generation
from preprocessor.template import RenderJob, check_template_policy, request_job
from preprocessor.template_sandbox import TemplateSandbox
from preprocessor.token_strings import TokenStrings
from preprocessor.tools.parsers import get_parser
from splice.errors import InvalidArgument
from splice.grammar import WHITESPACE_KINDS
from splice.grammar import check as check_grammar
from splice.model_info import ModelInfo
from splice.offload import inline_or_thread
from splice.request_rules import PROMPT_LOGPROBS_WITH_EMBEDS, check_ids, check_max_tokens
from splice.sampling import SamplingParams

MAX_DETOKENIZE_IDS = 1 << 20
# A text-only request up to this many characters (token IDs count as characters) is normalized on the event
# loop: its template and tokenizer take less time than a thread's hand-off (splice/offload.py). Anything larger,
# or with images or embeddings, goes to a thread.
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


def _plain_kwargs(kwargs: dict) -> bool:
    """Template arguments cheap to check on the loop: a few scalars (tools and documents are not)."""
    return len(kwargs) <= 8 and all(v is None or isinstance(v, (bool, int, float)) or
                                    (isinstance(v, str) and len(v) <= INLINE_NORMALIZE_CHARS) for v in kwargs.values())


@dataclass(frozen=True)
class Prepared:
    """A request's prompts, normalized and ready for the engine (one, or a batch of completions prompts)."""

    endpoint: str  # "chat" / "complete", for the metrics
    prompts: tuple[Normalized, ...]
    arrival: float  # time.perf_counter() when the request arrived
    request_id: str  # the caller's or a new one (each of several prompts' engine requests: request_id-i)

    @property
    def choices_per_prompt(self) -> int:
        return self.prompts[0].request.sampling.n

    @property
    def choices(self) -> int:
        """Choices the request answers: n per prompt."""
        return len(self.prompts) * self.choices_per_prompt

    @property
    def prompt_ids(self) -> list[list[int]]:
        """Each prompt's token IDs as the engine receives them (FILLER_ID at prompt_embeds positions, as vLLM
        reports 0 there)."""
        return [list(n.request.token_ids) for n in self.prompts]


class PreprocessorCore:
    def __init__(self, files: ModelFiles, info: ModelInfo, engine: EngineBackend | None = None,
                 limits: Limits | None = None, sandbox: TemplateSandbox | None = None) -> None:
        """`sandbox` renders request templates (when limits trust them); default: one of this core's own,
        started on first use and ended by close()."""
        self.files = files
        self.info = info
        self.limits = limits or Limits()
        # --tool-call-parser: finds the calls in an answer to tool_choice "auto" (preprocessor/tools/)
        self.tool_parser = get_parser(self.limits.tool_call_parser) if self.limits.tool_call_parser else None
        self._engine = engine
        self.eos = EosIds.of(files.tokenizer, info.eos_token_ids)  # how an answer's last token names its stop_reason
        self._token_text: dict[int, str] = {}  # token_texts' cache
        self._decode_kept = decoder(files.tokenizer, skip_special_tokens=False)
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
        job = request_job(f.tokenizer, conv, f.image_placeholder, f.sentinels)
        prompt = await self._sandbox.render_async(job)
        return lambda _: prompt

    def check_conversation(self, conv: Conversation) -> None:
        """The cheap bounds (request_bounds.py): a conversation that certainly cannot fit is refused before any of it
        is fetched, decoded, rendered or tokenized."""
        check_conversation(conv, self.info, self.files, self.limits)

    def _served(self, sampling: SamplingParams) -> SamplingParams:
        """`sampling` as this server serves it: a JSON grammar without whitespace when the server says so
        (--structured-outputs-config disable_any_whitespace), as a request may say for itself."""
        so = sampling.structured
        if so is None or so.kind not in WHITESPACE_KINDS or not self.limits.disable_any_whitespace:
            return sampling
        return dataclasses.replace(sampling, structured=dataclasses.replace(so, disable_any_whitespace=True))

    @staticmethod
    def _request_id(request_id: str) -> str:
        return request_id or uuid.uuid4().hex

    def normalize_chat(self, conv: Conversation, sampling: SamplingParams | None = None,
                       request_id: str = "", count_images: bool = False,
                       render_request: Callable[[RenderJob], str] | None = None) -> Normalized:
        return normalize_chat(conv, sampling or SamplingParams(), self._request_id(request_id), self.files,
                              self.info, self.limits, count_images, render_request or self._render_request)

    def normalize_complete(self, parts: Sequence[PromptPart], sampling: SamplingParams | None = None,
                           request_id: str = "", add_special_tokens: bool = True) -> Normalized:
        return normalize_complete(parts, sampling or SamplingParams(), self._request_id(request_id), self.files,
                                  self.info, self.limits, add_special_tokens)

    async def prepare_chat(self, conv: Conversation, sampling: SamplingParams, request_id: str = "",
                           lora: str = "") -> Prepared:
        """The conversation normalized, ready for generate(): every rejection happens here, before the engine is
        contacted. `lora`: the LoRA adapter it runs under (its name, already checked: preprocessor/loras.py)."""
        arrival = time.perf_counter()
        sampling = self._served(sampling)
        # Normalized fully before the engine is contacted: every rejection happens here. In a thread unless it is
        # short text (INLINE_NORMALIZE_CHARS) with plain template arguments and no structured output: checking a spec,
        # image processing, tensor decoding and long conversations would stall every other stream.
        inline = _plain_kwargs(conv.template_kwargs) and sampling.structured is None and \
            _inline(p for m in conv.messages for p in m.parts)
        check_max_tokens(sampling, self.info)
        await inline_or_thread(inline, self._check_chat, conv, sampling)
        rendered = await self._prerendered(conv)
        rid = self._request_id(request_id)
        normalized = await inline_or_thread(inline, self.normalize_chat, conv, sampling, rid, False, rendered)
        normalized.request.lora = lora
        _record("chat", normalized, arrival, conv.image_count)
        return Prepared("chat", (normalized,), arrival, rid)

    def _check_chat(self, conv: Conversation, sampling: SamplingParams) -> None:
        self.check_conversation(conv)
        _check_structured(sampling)
        _check_prompt_logprobs(sampling, conv.parts(Embeds))

    async def prepare_complete(self, prompts: Sequence[Sequence[PromptPart]], sampling: SamplingParams,
                               request_id: str = "", add_special_tokens: bool = True, lora: str = "") -> Prepared:
        """Each prompt normalized as its own engine request (request ID `request_id`-i when there are several),
        all of them before any reaches the engine: one bad prompt refuses the whole request. `add_special_tokens`:
        text prompts get the tokenizer's special tokens (BOS), vLLM's default (normalize_complete)."""
        arrival = time.perf_counter()
        if not prompts:
            raise InvalidArgument("the request has no prompt")
        if len(prompts) > self.limits.max_prompts:
            raise InvalidArgument(f"the request has {len(prompts)} prompts; at most {self.limits.max_prompts}")
        check_max_tokens(sampling, self.info)
        for prompt in prompts:  # the cheap bounds (request_bounds.py), before any prompt is decoded or tokenized
            check_prompt(prompt, self.info, self.files, self.limits)
        if sampling.structured is not None:  # (xgrammar parses it off the loop)
            await asyncio.to_thread(_check_structured, sampling)
        sampling = self._served(sampling)
        _check_prompt_logprobs(sampling, [p for prompt in prompts for p in prompt if isinstance(p, Embeds)])
        embeds = sum(isinstance(p, Embeds) for prompt in prompts for p in prompt)
        if embeds > self.limits.max_embeds_parts:  # (each prompt's own count is checked with it)
            raise InvalidArgument(f"the request has {embeds} prompt_embeds parts; at most "
                                  f"{self.limits.max_embeds_parts}")
        rid = self._request_id(request_id)
        ids = [rid] if len(prompts) == 1 else [f"{rid}-{i}" for i in range(len(prompts))]

        def normalize_all() -> list[Normalized]:
            return [self.normalize_complete(p, sampling, rid_i, add_special_tokens)
                    for p, rid_i in zip(prompts, ids, strict=True)]

        normalized = await inline_or_thread(_inline(p for prompt in prompts for p in prompt), normalize_all)
        for n in normalized:
            n.request.lora = lora
            _record("complete", n, arrival, 0)
        return Prepared("complete", tuple(normalized), arrival, rid)

    def generate(self, prepared: Prepared) -> AsyncIterator[tuple[int, GenerationChunk]]:
        """The answers of a prepared request's prompts, side by side: (choice index, chunk) as each comes. A prompt
        has SamplingParams.n choices; prompt p's choice j is the request's choice p x n + j (vLLM's numbering)."""
        merged = merge_streams([self._generate(n, prepared.endpoint, prepared.arrival) for n in prepared.prompts])
        n = prepared.choices_per_prompt
        return merged if n == 1 else _choice_indices(merged, n)  # (n = 1: the prompt index is the choice's)

    def answer_tokens(self, prepared: Prepared) -> int:
        """The most tokens a prepared request's choices can generate together: each prompt's n choices of up to
        max_tokens, within what its prompt leaves of max_model_len."""
        room = self.info.max_model_len
        return sum(n.request.sampling.n * min(n.request.sampling.max_tokens or room, room - n.request.prompt_len)
                   for n in prepared.prompts)

    async def _generate(self, normalized: Normalized, endpoint: str, arrival: float) -> AsyncIterator[GenerationChunk]:
        if self._engine is None:
            raise RuntimeError("this PreprocessorCore has no engine")
        first = True
        unfinished = normalized.request.sampling.n  # choices: the request ends with the last one's final chunk
        stream = stream_generation(normalized.request, self._engine, self.files.tokenizer, self.files.sentinels.id_set,
                                   self.eos)
        async with aclosing(stream) as chunks:
            async for chunk in chunks:
                if first:
                    metrics.TTFT_SECONDS.labels(endpoint).observe(time.perf_counter() - arrival)
                    first = False
                unfinished -= chunk.final
                if chunk.final and not unfinished:
                    metrics.E2E_SECONDS.labels(endpoint).observe(time.perf_counter() - arrival)
                yield chunk

    async def tokenize_chat(self, conv: Conversation) -> TokenizeResult:
        self.check_conversation(conv)
        rendered = await self._prerendered(conv)
        # In a thread, like Chat's normalization: images, embeds and long texts would stall every stream.
        n = await asyncio.to_thread(self.normalize_chat, conv, None, "", True, rendered)
        return TokenizeResult(tuple(n.request.token_ids),
                              tuple((s.offset, s.length, s.tensor_index) for s in n.request.embed_spans),
                              n.prompt, n.image_token_counts)

    def tokenize_text(self, text: str, add_special_tokens: bool = True) -> TokenizeResult:
        check_text(text, self.info, self.files)
        ids = tokenize_text(text, add_special_tokens, self.files, self.info)
        return TokenizeResult(tuple(ids), (), text, ())

    def detokenize(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if len(ids) > MAX_DETOKENIZE_IDS:
            raise InvalidArgument(f"{len(ids)} token IDs; at most {MAX_DETOKENIZE_IDS}")
        check_ids(ids, self.info)
        # Sentinel IDs can be valid engine IDs (padded tables) but never decode to the internal sentinel text.
        return self.files.tokenizer.decode(self.files.sentinels.drop(ids), skip_special_tokens=skip_special_tokens,
                                           clean_up_tokenization_spaces=False)

    def decode_ids(self, ids: list[int]) -> str:
        """Token IDs decoded together, special tokens kept: how vLLM completes a logprob token that is a piece of a
        character (preprocessor/token_strings.py)."""
        return self._decode_kept(ids)

    def token_strings(self, as_ids: bool = False) -> TokenStrings:
        """How logprobs spell this model's tokens (vLLM's rule for the pieces of a character); `as_ids`: each
        "token_id:N" (return_tokens_as_token_ids)."""
        return TokenStrings(self.token_texts, self.decode_ids, as_ids)

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


def _check_structured(sampling: SamplingParams) -> None:
    """A structured output's spec parses (splice/grammar.py; a recent one is not parsed again): a bad schema, regex
    or grammar is refused before the engine is contacted. The engine compiles it for its tokenizer."""
    if sampling.structured is not None:
        check_grammar(sampling.structured)


def _check_prompt_logprobs(sampling: SamplingParams, embeds: Sequence[Embeds]) -> None:
    """Before any part is decoded: prompt embeddings have no tokens to score (the engine refuses them too)."""
    if sampling.prompt_logprobs is not None and embeds:
        raise InvalidArgument(f"{PROMPT_LOGPROBS_WITH_EMBEDS} ({embeds[0].where})")


async def _choice_indices(chunks: AsyncIterator[tuple[int, GenerationChunk]],
                          n: int) -> AsyncIterator[tuple[int, GenerationChunk]]:
    """(prompt index, chunk) -> (choice index, chunk)."""
    async with aclosing(chunks) as each:
        async for prompt, chunk in each:
            yield prompt * n + chunk.index, chunk


def _record(endpoint: str, normalized: Normalized, arrival: float, images: int) -> None:
    request = normalized.request
    metrics.normalized(endpoint, time.perf_counter() - arrival, request.prompt_len, images, len(request.embed_spans))
