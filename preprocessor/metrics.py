"""Preprocessor metrics: what normalization costs and produces, and latency as the preprocessor sees it."""

from __future__ import annotations

from prometheus_client import Gauge, Histogram

from splice.metrics.rpc import LATENCY_BUCKETS

_LENGTH_BUCKETS = tuple(float(1 << k) for k in range(4, 18))  # 16 .. 131072 positions
_COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)

NORMALIZE_SECONDS = Histogram("splice_preprocessor_normalize_duration_seconds",
                              "Render + tokenize + images + embeds + validation of one request",
                              ["endpoint"], buckets=LATENCY_BUCKETS)  # chat | complete
PROMPT_TOKENS = Histogram("splice_preprocessor_prompt_tokens", "Prompt positions per normalized request",
                          ["endpoint"], buckets=_LENGTH_BUCKETS)
IMAGES = Histogram("splice_preprocessor_request_images", "Image parts per normalized request",
                   ["endpoint"], buckets=_COUNT_BUCKETS)
EMBEDS_PARTS = Histogram("splice_preprocessor_request_prompt_embeds_parts",
                         "prompt_embeds parts per normalized request", ["endpoint"], buckets=_COUNT_BUCKETS)
TTFT_SECONDS = Histogram("splice_preprocessor_time_to_first_token_seconds",
                         "From the request's arrival to its first streamed chunk", ["endpoint"],
                         buckets=LATENCY_BUCKETS)
E2E_SECONDS = Histogram("splice_preprocessor_e2e_request_latency_seconds",
                        "From the request's arrival to its final chunk (finished requests only)", ["endpoint"],
                        buckets=LATENCY_BUCKETS)
ENGINE_CONNECTED = Gauge("splice_preprocessor_engine_connected",
                         "1 while the engine answers and the preprocessor serves, else 0")


def normalized(endpoint: str, seconds: float, prompt_tokens: int, images: int, embeds_parts: int) -> None:
    NORMALIZE_SECONDS.labels(endpoint).observe(seconds)
    PROMPT_TOKENS.labels(endpoint).observe(prompt_tokens)
    IMAGES.labels(endpoint).observe(images)
    EMBEDS_PARTS.labels(endpoint).observe(embeds_parts)
