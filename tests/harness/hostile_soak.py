"""Issue 40's soak: normal streaming clients over HTTP (chat, completions, chat with a picture) beside a loop of the
issue's hostile inputs (deep JSON, huge tool lists and token-ID controls, large grammars, readers that never read,
prompt logprobs of long prompts, many choices, a large whole answer). Each normal request must stream to its end
(200, no error event, a finish reason); the hostile ones are counted by status (never a 5xx). bench/hostile_soak.py
runs a clean stretch, then the loop, and prints both side by side; tests/integration/test_hostile_soak.py a short
one."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import socket
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from app.launch import Service
from app.scrape import scrape, value

TIMEOUT = 300.0  # one request's deadline: a stalled stream is an error, not a hang
KINDS = ("chat", "completion", "picture")


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)  # normal requests: sent -> [DONE], seconds
    sent: list[float] = field(default_factory=list)  # when each of them was sent (time.monotonic())
    windows: list[tuple[str, float, float]] = field(default_factory=list)  # hostile input, its start and end
    requests: Counter = field(default_factory=Counter)  # normal requests by kind
    errors: list[str] = field(default_factory=list)  # normal requests that did not stream to their end
    hostile: dict[str, Counter] = field(default_factory=dict)  # hostile input -> its statuses (or outcome)
    seconds: float = 0.0

    def pct(self, q: int) -> float:
        return statistics.quantiles(self.latencies, n=100)[q - 1] if len(self.latencies) > 1 else float("nan")

    def during(self) -> dict[str, float]:
        """Hostile input -> the p99 latency of the normal requests in flight while it was served."""
        out: dict[str, list[float]] = {}
        for name, start, end in self.windows:
            out.setdefault(name, []).extend(lat for t, lat in zip(self.sent, self.latencies, strict=True)
                                            if t <= end and t + lat >= start)
        return {name: statistics.quantiles(lats, n=100)[98] if len(lats) > 1 else float("nan")
                for name, lats in out.items()}

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {self.requests[k]}" for k in KINDS)
        line = (f"{sum(self.requests.values())} normal requests ({kinds}) in {self.seconds:.0f} s, errors "
                f"{len(self.errors)}; latency p50 {self.pct(50):.2f} s p99 {self.pct(99):.2f} s")
        hostile = "; ".join(f"{name} {dict(statuses)}" for name, statuses in self.hostile.items())
        return line + (f"\n  hostile: {hostile}" if hostile else "") + "".join(f"\n  {e}" for e in self.errors[:10])


def picture_uri(width: int = 96, height: int = 64) -> str:
    from app.demo import sample_picture

    buf = io.BytesIO()
    sample_picture(width, height).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _normal(rng: random.Random, kind: str, picture: str) -> tuple[str, dict]:
    words = " ".join(rng.choice(("red", "blue", "story", "tell", "me", "about", "a", "cat")) for _ in
                     range(rng.randint(1, 20)))
    body: dict = {"max_tokens": rng.randint(4, 32), "stream": True, "ignore_eos": rng.random() < 0.5}
    body.update({"temperature": 0.0} if rng.random() < 0.5 else {"temperature": 0.8, "seed": rng.randrange(2**31)})
    if kind == "completion":
        return "/v1/completions", {**body, "prompt": words}
    content: list | str = words
    if kind == "picture":
        content = [{"type": "image_url", "image_url": {"url": picture}}, {"type": "text", "text": words}]
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": content}]}


async def _stream(http: httpx.AsyncClient, path: str, body: dict) -> str | None:
    """Streams one answer to [DONE]; None when it ended normally, else what went wrong."""
    async with http.stream("POST", path, json=body) as answer:
        if answer.status_code != 200:
            return f"status {answer.status_code}: {(await answer.aread())[:200]!r}"
        finished, done = False, False
        async for line in answer.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    return f"error event {event['error']}"
                finished |= any(c.get("finish_reason") for c in event.get("choices", ()))
        return None if done and finished else f"stream ended without {'[DONE]' if finished else 'a finish reason'}"


Done = Callable[[], bool]  # whether a stretch is over


def until(deadline: float) -> Done:
    """Over at `deadline`, a time.monotonic() (one clock for every process on the machine)."""
    return lambda: time.monotonic() >= deadline


def after(seconds: float) -> Done:
    return until(time.monotonic() + seconds)


async def normal_clients(base: str, streams: int, done: Done, run: Run, seed: int = 0) -> None:
    """`streams` clients, each sending one streamed request after another until `done()`."""
    picture = picture_uri()

    async def client(i: int) -> None:
        rng = random.Random(f"{seed}-{i}")
        async with httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
            n = 0
            while not done():
                kind = KINDS[(i + n) % len(KINDS)]
                n += 1
                path, body = _normal(rng, kind, picture)
                sent = time.monotonic()
                try:
                    problem = await _stream(http, path, body)
                except (httpx.HTTPError, json.JSONDecodeError) as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                if problem is not None:
                    run.errors.append(f"client {i} request {n} ({kind}): {problem}")
                    continue
                run.latencies.append(time.monotonic() - sent)
                run.sent.append(sent)
                run.requests[kind] += 1

    began = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(streams)))
    run.seconds = time.monotonic() - began


# --- the hostile inputs -------------------------------------------------------------------------------------------

HI = [{"role": "user", "content": "Hi"}]


def _deep_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _grammar(seed: int, kib: int) -> str:
    """A distinct grammar of about `kib` KiB: a sequence of negated character classes (issue 40 row 4)."""
    rng = random.Random(seed)
    rules = []
    while 7 * len(rules) < kib * 1024 - 16:  # each "[^xyz] "
        rules.append(f'[^{"".join(rng.sample("abcdefghijklmnopqrstuvwxyz", 3))}]')
    return "root ::= " + " ".join(rules)


def hostile_bodies(n: int) -> dict[str, Callable[[int], dict | bytes]]:
    """Input name -> its request body for loop iteration k (JSON, or raw bytes), posted to /v1/chat/completions.
    `n`: the choices of a request that asks for many (row 12's refused when over --max-seqs-per-request)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    return {
        "deep_tool": lambda k: {"messages": HI, "max_tokens": 2, "tool_choice": "none", "tools": [
            {"type": "function", "function": {"name": "deep", "parameters": _deep_schema(100)}}]},
        "deep_arguments": lambda k: {"max_tokens": 2, "messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}]},
            {"role": "user", "content": "y"}]},
        "deep_model_call": lambda k: {"messages": HI, "max_tokens": 1600, "tools": [tool],
                                      "guided_grammar": 'root ::= "<tool_call>" ' + " ".join(['"["'] * 1500)},
        "large_grammar": lambda k: {"messages": HI, "max_tokens": 4, "guided_grammar": _grammar(k, 64)},
        "deep_spec": lambda k: {"messages": HI, "max_tokens": 2, "guided_json": '{"items":' * 1000 + "{}" + "}" * 1000},
        "many_tools": lambda k: {"messages": HI, "max_tokens": 2, "tool_choice": "none", "tools": [
            {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
            for i in range(60_000)]},
        "logit_bias": lambda k: (b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logit_bias": {'
                                 + b",".join(b'"%d": 1.0' % i for i in range(2_000_000)) + b"}}"),
        "allowed_ids": lambda k: (b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, '
                                  b'"allowed_token_ids": [' + b",".join([b"1"] * 10_000_000) + b"]}"),
        "many_choices": lambda k: {"messages": HI, "max_tokens": 2000, "n": n, "ignore_eos": True},
        "wont_hold": lambda k: {"messages": HI, "max_tokens": 2, "guided_json": {
            "type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}}},
        "salted_pictures": lambda k: {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": picture_uri(120, 90)}}, {"type": "text", "text": "What?"}]}],
            "max_tokens": 4, "cache_salt": f"tenant-{k % 3}"},
        "whole_answer": lambda k: {"messages": HI, "max_tokens": 500, "n": 8, "ignore_eos": True, "logprobs": True,
                                   "top_logprobs": 20},
    }


async def _post(http: httpx.AsyncClient, body: dict | bytes) -> int:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = await http.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    return answer.status_code


def silent_reader(address: str, body: dict) -> socket.socket:
    """A client that sends a streamed chat request and never reads its answer (a small receive buffer, so the
    server's writes back up soon)."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


async def silent_readers(engine: Service | str, address: str, readers: int, n: int, wait: float) -> str:
    """Row 9: `readers` clients that never read, each n choices x 2000 tokens with 20 logprobs; held open until every
    sequence is paused on the engine (or `wait` seconds), then closed, and waited on until the engine has let every
    paused sequence go (the closed connections cancel them). Returns what was seen: "paused" when both happened."""
    async def paused() -> float:
        return value(await asyncio.to_thread(scrape, engine), "splice_engine_num_requests_paused")

    async def until(done: Callable[[float], bool]) -> bool:
        deadline = time.monotonic() + wait
        while not done(await paused()):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
        return True

    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "stream": True, "n": n, "max_tokens": 2000,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 20}
    sockets = [silent_reader(address, body) for _ in range(readers)]
    try:
        held = await until(lambda count: count >= readers * n)
    finally:
        for sock in sockets:
            sock.close()
    released = await until(lambda count: count == 0)
    return ("paused" if held else "not paused") + ("" if released else f", still paused {wait:.0f} s after closing")


async def prompt_logprobs(http: httpx.AsyncClient, requests: int, positions: int) -> list[int]:
    """Row 10: `requests` at once, each prompt_logprobs 20 on a prompt of `positions` token IDs."""
    async def one(k: int) -> int:
        rng = random.Random(k)
        body = {"prompt": [rng.randrange(40, 600) for _ in range(positions)], "max_tokens": 1, "prompt_logprobs": 20}
        return (await http.post("/v1/completions", json=body)).status_code

    return await asyncio.gather(*(one(k) for k in range(requests)))


async def hostile_loop(engine: Service | str, address: str, done: Done, run: Run, only: list[str] | None = None,
                       readers: int = 8, choices: int = 16, many: int = 64, silent_wait: float = 30.0,
                       rounds: int | None = None) -> None:
    """Every hostile input in turn, against the HTTP face at `address`, again and again until `done()` (or `rounds`
    times); statuses into `run.hostile`. `engine`: the engine, or its metrics HOST:PORT (the silent readers watch its
    paused requests)."""
    bodies = hostile_bodies(many)
    actions: dict[str, Callable[[httpx.AsyncClient, int], Awaitable[object]]] = {
        name: (lambda http, k, make=make: _post(http, make(k))) for name, make in bodies.items()}
    actions["silent_readers"] = lambda http, k: silent_readers(engine, address, readers, choices, silent_wait)
    actions["prompt_logprobs"] = lambda http, k: prompt_logprobs(http, 4, 1500)
    names = [name for name in actions if only is None or name in only]
    k = 0
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=TIMEOUT) as http:
        while not done() and (rounds is None or k < rounds):
            for name in names:
                if done():
                    break
                start = time.monotonic()
                try:
                    outcome = await actions[name](http, k)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                run.windows.append((name, start, time.monotonic()))
                for one in outcome if isinstance(outcome, list) else [outcome]:
                    run.hostile.setdefault(name, Counter())[one] += 1
            k += 1
