"""The soak workload: N concurrent streams for D seconds, each sending one request after another (text, prompt
embeddings or an image, in turn; sampled lengths, greedy and seeded sampling) through the real async client. It
records errors and, for every request, whether the tokens it received equal its usage.completion_tokens (and its
max_tokens when it ended by length); counts, tok/s, latency and TTFT p50/p99, and the services' RSS at start and end.
tests/integration/test_soak.py runs a short one; bench/soak.py a long one; faults.py its normal traffic."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field

import torch

from clients import AsyncSpliceClient, SpliceClientError
from splice.model_info import ModelInfo
from tests.harness.up import rss_mib

KINDS = ("text", "embeds", "image")
TIMEOUT = 120.0  # one request's deadline: a stalled stream is an error, not a hang


@dataclass
class SoakResult:
    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    errors: list[str] = field(default_factory=list)  # calls that failed: none expected
    mismatches: list[str] = field(default_factory=list)  # tokens received != usage (or max_tokens)
    tokens: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, request sent -> final chunk
    ttfts: list[float] = field(default_factory=list)  # seconds, request sent -> first token
    seconds: float = 0.0
    rss: dict[str, tuple[float, float]] = field(default_factory=dict)  # service -> (start, end) MiB

    @property
    def ok(self) -> bool:
        return not self.errors and not self.mismatches and sum(self.requests.values()) > 0

    def report(self) -> str:
        def pct(values: list[float], q: float) -> float:
            return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else float("nan")

        total = sum(self.requests.values())
        lines = [f"requests {total} ({', '.join(f'{k} {n}' for k, n in self.requests.items())}) in "
                 f"{self.seconds:.0f} s; errors {len(self.errors)}; token/usage mismatches {len(self.mismatches)}",
                 f"tokens {self.tokens}: {self.tokens / self.seconds:.1f} tok/s; "
                 f"latency p50 {pct(self.latencies, 50):.0f} ms p99 {pct(self.latencies, 99):.0f} ms; "
                 f"TTFT p50 {pct(self.ttfts, 50):.0f} ms p99 {pct(self.ttfts, 99):.0f} ms"]
        lines += [f"{name} RSS {a:.0f} MiB -> {b:.0f} MiB ({b - a:+.0f})" for name, (a, b) in self.rss.items()]
        lines += [f"  {e}" for e in (self.errors + self.mismatches)[:20]]
        return "\n".join(lines)


class Workload:
    """Request n of stream i: deterministic given (seed, i, n)."""

    def __init__(self, info: ModelInfo, seed: int = 0) -> None:
        from app.demo import sample_picture

        self.info, self.seed = info, seed
        # few sizes, made once: drawing a picture is slow Python, and the tiling still varies
        self.pictures = [sample_picture(w, h) for w, h in ((48, 32), (96, 64), (160, 120), (64, 200))]

    def request(self, i: int, n: int) -> tuple[str, list, dict]:
        rng = random.Random(f"{self.seed}-{i}-{n}")
        kind = KINDS[(i + n) % len(KINDS)] if self.info.accepts_images else KINDS[(i + n) % 2]
        words = " ".join(rng.choice(("red", "blue", "story", "tell", "me", "about", "a", "cat")) for _ in
                         range(rng.randint(1, 24)))
        content: list = [{"type": "text", "text": words}]
        if kind == "embeds":
            rows = torch.randn(rng.randint(1, 24), self.info.hidden_size,
                               generator=torch.Generator().manual_seed(rng.randrange(2**31))) * 0.02
            content.insert(rng.randint(0, 1), {"type": "prompt_embeds", "prompt_embeds": rows})
        elif kind == "image":
            content.insert(0, {"type": "image", "image": rng.choice(self.pictures)})
        sampling = {"max_tokens": rng.randint(1, 48), "ignore_eos": rng.random() < 0.5}
        if rng.random() < 0.5:
            sampling.update(temperature=0.0)
        else:
            sampling.update(temperature=0.8, top_p=0.95, seed=rng.randrange(2**31))
        return kind, [{"role": "user", "content": content}], sampling


async def _stream(target: str, i: int, work: Workload, until: float, result: SoakResult, **client) -> None:
    async with AsyncSpliceClient(target, timeout=TIMEOUT, **client) as c:
        n = 0
        while time.monotonic() < until:
            kind, messages, sampling = work.request(i, n)
            n += 1
            sent, first, got, last = time.monotonic(), None, 0, None
            try:
                async for chunk in c.chat(messages, **sampling):
                    if first is None and chunk.token_ids:
                        first = time.monotonic()
                    got += len(chunk.token_ids)
                    last = chunk
            except SpliceClientError as exc:
                result.errors.append(f"stream {i} request {n} ({kind}): {exc.code.name}: {exc.details}")
                continue
            result.requests[kind] += 1
            result.latencies.append(time.monotonic() - sent)
            if first is not None:
                result.ttfts.append(first - sent)
            result.tokens += got
            usage = last.usage if last else None
            if usage is None or last.finish_reason is None or got != usage.completion_tokens or (
                    last.finish_reason == "length" and got != sampling["max_tokens"]):
                result.mismatches.append(f"stream {i} request {n} ({kind}): received {got} tokens, usage "
                                         f"{usage and usage.completion_tokens}, finish {last and last.finish_reason}, "
                                         f"max_tokens {sampling['max_tokens']}")


async def soak(target: str, streams: int, seconds: float, pids: dict[str, int] | None = None, seed: int = 0,
               **client) -> SoakResult:
    """Runs the soak against `target`; `pids`: service name -> pid whose RSS to report; `client`: TLS / key."""
    async with AsyncSpliceClient(target, timeout=30, **client) as c:
        work = Workload(await c.model_info(), seed)
    result = SoakResult()
    start_rss = {name: rss_mib(pid) for name, pid in (pids or {}).items()}
    began = time.monotonic()
    await asyncio.gather(*(_stream(target, i, work, began + seconds, result, **client) for i in range(streams)))
    result.seconds = time.monotonic() - began
    result.rss = {name: (start_rss[name], rss_mib(pid)) for name, pid in (pids or {}).items()}
    return result
