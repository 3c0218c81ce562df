"""The engine's prefix cache (engine/prefix_cache.py) through the whole stack (gRPC faces, engine and preprocessor
processes on loopback), three figures, each side measured in turns in one run, ratio per repeat:

    python -m bench.prefix_cache [--model smollm2-135m-instruct] [--vlm-model tiny-idefics3-colors] [--repeats 3]
                                 [--system-tokens 1500] [--user-tokens 20] [--turns 5] [--answer-tokens 16]
                                 [--streams 32] [--prefix-tokens 1000] [--new-tokens 32] [--parts a b c] [--quick]

(a) TTFT (first streamed chunk of a gRPC Chat, max_tokens 1) of a SYSTEM_TOKENS system prompt + a new USER_TOKENS
    user turn, on MODEL with the cache on: the system prompt cached (the same one, warmed by one earlier request)
    vs one of equal length that is not (fresh random words each repeat). Target <= 0.2x.
(b) a TURNS-turn gRPC Chat on VLM_MODEL, the first user message a picture + prompt embeds (rows of the model's own
    embedding table) + text, each turn re-sending the whole history (picture, embeds, earlier turns and answers of
    ANSWER_TOKENS greedy tokens): TTFT per turn, a stack with the cache on vs one with --no-enable-prefix-caching.
    Every repeat is a new conversation (another picture, other embeds), so its first turn is never cached.
(c) STREAMS Complete streams arriving together on MODEL, each a shared PREFIX_TOKENS prefix + its own USER_TOKENS
    (ordinary token IDs), NEW_TOKENS tokens each (greedy, ignore_eos): tok/s = generated tokens / wall time, a stack
    with the cache on vs one with --no-enable-prefix-caching. Each repeat draws a new prefix, sent alone first
    (max_tokens 1, untimed, to both stacks) so the "on" stack holds it; the "on" engine's prefix-cache hit rate over
    the timed streams (splice_engine_prefix_cache_hits_total / _queries_total, prompt positions) is printed.
    Target >= 3x.
(a) and (c) share the two MODEL stacks; all stacks are started before any figure and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from app.demo import embedding_rows
from app.launch import Service
from app.models import resolve_model
from app.scrape import scrape, value
from bench.common import in_turns_async, png, report
from bench.stacks import engine_flags, running_stack, stack_parser, stack_run, warm
from clients import AsyncSpliceClient

QUICK = {"repeats": 1, "system_tokens": 300, "turns": 2, "answer_tokens": 4, "streams": 4, "prefix_tokens": 200,
         "new_tokens": 8}
OFF = ["--no-enable-prefix-caching"]
PROSE = ("the sea river mountain city light music garden winter summer morning evening story window letter "
         "market station bridge forest island field road house table chair paper stone cloud rain wind fire "
         "water bird horse apple bread coffee voice dream friend teacher doctor engine signal number question "
         "answer reason moment history science language picture colour yellow purple orange silver golden "
         "quiet bright early late small large ancient modern simple careful gentle strong open narrow")
WORDS = PROSE.split()  # the words of every random text
QUERIES = "hits", "queries"


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


async def text_of(client: AsyncSpliceClient, rng: random.Random, tokens: int) -> str:
    """Random words, `tokens` tokens long (the text of the first `tokens` tokens of more words than that)."""
    ids = (await client.tokenize(text=words(rng, tokens + 8), add_special_tokens=False)).token_ids
    return await client.detokenize(ids[:tokens])


async def first_chunk(client: AsyncSpliceClient, messages: list[dict], max_tokens: int) -> tuple[float, str, int]:
    """Seconds to the first streamed chunk of a greedy ignore_eos chat, the whole answer's text, the prompt's length."""
    start, ttft, text, prompt = time.perf_counter(), None, [], 0
    async for chunk in client.chat(messages, temperature=0.0, max_tokens=max_tokens, ignore_eos=True):
        ttft = ttft if ttft is not None else time.perf_counter() - start
        text.append(chunk.text)
        prompt = chunk.usage.prompt_tokens if chunk.usage is not None else prompt
    assert ttft is not None, "no chunk"
    return ttft, "".join(text), prompt


def hit_counts(engine: Service) -> dict[str, float]:
    samples = scrape(engine)
    return {n: value(samples, f"splice_engine_prefix_cache_{n}_total") for n in QUERIES}


# -- (a) -------------------------------------------------------------------------------------------------------------

async def system_prompt_ttft(args: argparse.Namespace, client: AsyncSpliceClient) -> None:
    rng = random.Random(0)
    system = await text_of(client, rng, args.system_tokens)

    async def ask(system_text: str) -> float:
        user = await text_of(client, rng, args.user_tokens)
        messages = [{"role": "system", "content": system_text}, {"role": "user", "content": user}]
        return (await first_chunk(client, messages, 1))[0]

    async def uncached() -> float:
        return await ask(await text_of(client, rng, args.system_tokens))

    await ask(system)  # caches the system prompt
    await uncached()  # a full prefill once before the figures
    sides = {"cached": lambda: ask(system), "uncached": uncached}
    ms = {k: [t * 1e3 for t in v] for k, v in (await in_turns_async(sides, args.repeats)).items()}
    report(f"(a) {args.model}: TTFT, {args.system_tokens}-token system prompt + new {args.user_tokens}-token user "
           "turn (gRPC Chat), cached system prompt vs uncached (target <= 0.2)", ms["cached"], ms["uncached"], "ms")


# -- (b) -------------------------------------------------------------------------------------------------------------

async def chat_turns_ttft(args: argparse.Namespace, clients: dict[str, AsyncSpliceClient],
                          engines: dict[str, Service]) -> None:
    folder = resolve_model(args.vlm_model)
    per_turn: dict[str, list[list[float]]] = {side: [] for side in clients}
    repeat = {side: 0 for side in clients}
    lengths = [0] * args.turns  # each turn's prompt tokens
    hits = [[0.0, 0.0] for _ in range(args.turns)]  # the "on" engine's hit and queried positions per turn
    answers: dict[str, list[list[str]]] = {side: [] for side in clients}  # per conversation (greedy: the same)

    async def conversation(side: str) -> float:
        """One conversation, a new one per repeat (the same on both sides); the sum of its turns' TTFTs."""
        k = repeat[side] = repeat[side] + 1
        rng = random.Random(k)
        embeds = embedding_rows(folder, [rng.randrange(40, 600) for _ in range(8)])
        messages: list[dict] = [{"role": "user", "content": [
            {"type": "image", "image": png(seed=k)}, {"type": "prompt_embeds", "prompt_embeds": embeds},
            {"type": "text", "text": words(rng, 12)}]}]
        ttfts = []
        for t in range(args.turns):
            before = hit_counts(engines[side]) if side == "on" else None
            ttft, answer, lengths[t] = await first_chunk(clients[side], messages, args.answer_tokens)
            ttfts.append(ttft * 1e3)
            if before is not None and k > 1:
                after = hit_counts(engines[side])
                hits[t] = [h + after[n] - before[n] for h, n in zip(hits[t], QUERIES, strict=True)]
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": words(rng, 12)}]
        per_turn[side].append(ttfts)
        answers[side].append([m["content"] for m in messages if m["role"] == "assistant"])
        return sum(ttfts)

    for side in clients:  # one conversation each before the figures (its repeat number is not used again)
        await conversation(side)
    await in_turns_async({side: lambda s=side: conversation(s) for side in clients}, args.repeats)
    for t in range(args.turns):
        report(f"(b) {args.vlm_model}: TTFT of turn {t + 1}/{args.turns} ({lengths[t]}-token prompt: picture + "
               f"prompt embeds + history, gRPC Chat; on: {hits[t][0] / max(hits[t][1], 1):.0%} of its positions "
               "cached), cache on vs off", [r[t] for r in per_turn["on"][1:]], [r[t] for r in per_turn["off"][1:]],
               "ms")
    same = sum(a == b for a, b in zip(answers["on"], answers["off"], strict=True))
    print(f"(b) greedy answers the same with the cache on and off in {same} of {len(answers['on'])} conversations",
          flush=True)


# -- (c) -------------------------------------------------------------------------------------------------------------

async def shared_prefix_throughput(args: argparse.Namespace, clients: dict[str, AsyncSpliceClient],
                                   engines: dict[str, Service]) -> None:
    hits: dict[str, float] = {n: 0.0 for n in QUERIES}
    draws = {side: 0 for side in clients}

    def batch(k: int, streams: int) -> tuple[list[int], list[list[int]]]:
        g = torch.Generator().manual_seed(1000 + k)
        prefix = torch.randint(40, 600, (args.prefix_tokens,), generator=g).tolist()
        return prefix, [prefix + torch.randint(40, 600, (args.user_tokens,), generator=g).tolist()
                        for _ in range(streams)]

    async def run(side: str, streams: int) -> float:
        k = draws[side] = draws[side] + 1
        prefix, prompts = batch(k, streams)
        await stack_run(clients[side], [prefix], [1])  # the shared prefix, alone first (the "on" side keeps it)
        before = hit_counts(engines[side]) if side == "on" else None
        tps = await stack_run(clients[side], prompts, [args.new_tokens] * streams)
        if before is not None:
            for n, v in hit_counts(engines[side]).items():
                hits[n] += v - before[n]
        return tps

    # two streams once before the figures: the path of a hit among others, and of a long prompt, taken once
    await in_turns_async({side: lambda s=side: run(s, 2) for side in clients}, 1)
    hits.update(dict.fromkeys(QUERIES, 0.0))
    tps = await in_turns_async({side: lambda s=side: run(s, args.streams) for side in clients}, args.c_repeats)
    report(f"(c) {args.model}: tok/s of {args.streams} streams arriving together, shared {args.prefix_tokens}-token "
           f"prefix + own {args.user_tokens}, {args.new_tokens} new tokens each, cache on vs off (target >= 3)",
           tps["on"], tps["off"], "tok/s")
    for side, engine in engines.items():
        total = hit_counts(engine)
        print(f"(c) {side} engine /metrics over the whole run: prefix-cache hits {total['hits']:.0f} of "
              f"{total['queries']:.0f} prompt positions", flush=True)
    print(f"(c) on: hit rate over the timed streams {hits['hits'] / max(hits['queries'], 1):.3f} "
          f"({hits['hits']:.0f} of {hits['queries']:.0f} prompt positions)", flush=True)


async def main() -> None:
    parser = stack_parser(__doc__, QUICK, model="smollm2-135m-instruct", streams=32, new_tokens=32)
    parser.add_argument("--vlm-model", default="tiny-idefics3-colors", help="the model of (b): a vision model")
    for name, default in (("system_tokens", 1500), ("user_tokens", 20), ("turns", 5), ("answer_tokens", 16),
                          ("prefix_tokens", 1000), ("c_repeats", 1)):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--parts", nargs="+", choices=("a", "b", "c"), default=["a", "b", "c"])
    args = parser.parse_args()
    started = time.perf_counter()
    flags = [*engine_flags(args), "--metrics-port", "0"]
    with contextlib.ExitStack() as services:
        async with contextlib.AsyncExitStack() as closing:
            engines: dict[str, Service] = {}
            clients: dict[str, AsyncSpliceClient] = {}
            vlm: dict[str, AsyncSpliceClient] = {}
            vlm_engines: dict[str, Service] = {}
            for side, more in (("on", []), ("off", OFF)):
                if {"a", "c"} & set(args.parts) and (side == "on" or "c" in args.parts):
                    engines[side], pre = services.enter_context(running_stack(args.model,
                                                                              engine_args=[*flags, *more]))
                    clients[side] = await closing.enter_async_context(AsyncSpliceClient(pre.address, timeout=600))
                if "b" in args.parts:
                    vlm_engines[side], pre = services.enter_context(running_stack(args.vlm_model,
                                                                                  engine_args=[*flags, *more]))
                    vlm[side] = await closing.enter_async_context(AsyncSpliceClient(pre.address, timeout=600))
            for client in [*clients.values(), *vlm.values()]:
                await warm(client)
            print(f"stacks up in {time.perf_counter() - started:.0f} s; {args.repeats} repeats of (a) and (b), "
                  f"{args.c_repeats} of (c)", flush=True)
            if "a" in args.parts:
                await system_prompt_ttft(args, clients["on"])
            if "b" in args.parts:
                await chat_turns_ttft(args, vlm, vlm_engines)
            if "c" in args.parts:
                await shared_prefix_throughput(args, clients, engines)
    print(f"whole run {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
