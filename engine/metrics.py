"""Engine metrics. LLMEngine records them once per step or per request, never per token."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from splice.metrics.rpc import LATENCY_BUCKETS

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

RUNNING = Gauge("splice_engine_num_requests_running", "Sequences in the running batch (after the last schedule)")
WAITING = Gauge("splice_engine_num_requests_waiting", "Sequences queued for a running slot (after the last schedule)")
PAUSED = Gauge("splice_engine_num_requests_paused",
               "Running sequences not decoded at the last schedule: their reader is --max-unread-tokens behind")
PROMPT_TOKENS = Counter("splice_engine_prompt_tokens", "Prompt positions prefilled (text, image and embeds)")
GENERATION_TOKENS = Counter("splice_engine_generation_tokens", "Tokens generated and sent to callers")
FINISHED = Counter("splice_engine_requests_finished", "Sequences that left the engine, by why",
                   ["finish_reason"])  # stop | length | abort | error
DECODE_BATCH = Histogram("splice_engine_decode_batch_size", "Sequences advanced by one decode step",
                         buckets=_SIZE_BUCKETS)
PREFILL_BATCH = Histogram("splice_engine_prefill_batch_size", "Sequences prefilled together in one step",
                          buckets=_SIZE_BUCKETS)
STEP_SECONDS = Histogram("splice_engine_step_duration_seconds", "Wall time of one engine step (forward + sampling)",
                         ["phase"], buckets=_STEP_BUCKETS)  # prefill | decode
TTFT_SECONDS = Histogram("splice_engine_time_to_first_token_seconds",
                         "From Generate's arrival (before validation) to its first token", buckets=LATENCY_BUCKETS)

ENCODER_CACHE_QUERIES = Counter("splice_engine_encoder_cache_queries",
                                "Pictures (tiles for Idefics3, SmolVLM, LFM2-VL) looked up in the encoder cache")
ENCODER_CACHE_HITS = Counter("splice_engine_encoder_cache_hits",
                             "Encoder cache lookups answered without running the vision tower")
ENCODER_CACHE_BYTES = Gauge("splice_engine_encoder_cache_bytes",
                            "Bytes of vision-tower outputs the encoder cache holds")
PREFIX_CACHE_QUERIES = Counter("splice_engine_prefix_cache_queries",
                               "Prompt positions of requests looked up in the prefix cache (vLLM's "
                               "prefix_cache_queries)")
PREFIX_CACHE_HITS = Counter("splice_engine_prefix_cache_hits",
                            "Prompt positions read from the prefix cache instead of prefilled (vLLM's "
                            "prefix_cache_hits)")
PREFIX_CACHE_BLOCKS = Gauge("splice_engine_prefix_cache_blocks", "Key/value blocks the prefix cache holds")
PREFIX_CACHE_RESETS = Counter("splice_engine_prefix_cache_resets",
                              "ResetPrefixCache calls this replica carried out (vLLM's /reset_prefix_cache)")

# label children resolved once: the loop pays no label lookup
_PREFILL_SECONDS = STEP_SECONDS.labels(phase="prefill")
_DECODE_SECONDS = STEP_SECONDS.labels(phase="decode")


class EngineStats:
    """What LLMEngine calls from its thread; NoStats (warmup) records nothing."""

    def scheduled(self, running: int, waiting: int, paused: int = 0) -> None:
        RUNNING.set(running)
        WAITING.set(waiting)
        PAUSED.set(paused)

    def prefilled(self, batch: int, prompt_tokens: int, seconds: float, ttfts: list[float]) -> None:
        PREFILL_BATCH.observe(batch)
        PROMPT_TOKENS.inc(prompt_tokens)
        _PREFILL_SECONDS.observe(seconds)
        for t in ttfts:
            TTFT_SECONDS.observe(t)

    def decoded(self, batch: int, seconds: float) -> None:
        DECODE_BATCH.observe(batch)
        _DECODE_SECONDS.observe(seconds)

    def generated(self, tokens: int) -> None:
        GENERATION_TOKENS.inc(tokens)

    def finished(self, reason: str) -> None:
        FINISHED.labels(finish_reason=reason).inc()

    def encoder_cache(self, queries: int, hits: int, held: int) -> None:
        ENCODER_CACHE_QUERIES.inc(queries)
        ENCODER_CACHE_HITS.inc(hits)
        ENCODER_CACHE_BYTES.set(held)

    def prefix_cache(self, queries: int, hits: int, blocks: int) -> None:
        PREFIX_CACHE_QUERIES.inc(queries)
        PREFIX_CACHE_HITS.inc(hits)
        PREFIX_CACHE_BLOCKS.set(blocks)


class NoStats(EngineStats):
    def scheduled(self, running: int, waiting: int, paused: int = 0) -> None:
        pass

    def prefilled(self, batch: int, prompt_tokens: int, seconds: float, ttfts: list[float]) -> None:
        pass

    def decoded(self, batch: int, seconds: float) -> None:
        pass

    def generated(self, tokens: int) -> None:
        pass

    def finished(self, reason: str) -> None:
        pass

    def encoder_cache(self, queries: int, hits: int, held: int) -> None:
        pass

    def prefix_cache(self, queries: int, hits: int, blocks: int) -> None:
        pass
