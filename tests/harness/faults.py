"""Fault scenarios against a stack run by `splice up` (its supervision is part of what is tested), each an Outcome
of figures and the outcomes that did not hold:

  kill9         engine SIGKILL mid-stream: every running stream ends UNAVAILABLE (target: within 2 s), splice up
                restarts the engine, the next request succeeds.
  sigstop       engine SIGSTOP mid-stream (a hung host): what running streams and a new request see and when;
                SIGCONT: the engine is the same process (nothing restarted) and serves again.
  preprocessor  preprocessor SIGKILL mid-stream: streams end UNAVAILABLE, splice up restarts it on its port, the
                next request succeeds as fast as before (the aborted sequences do not linger in the engine).
  hostile       normal traffic (soak.py's mixed workload) measured clean, then again beside hostile traffic:
                request templates that would run for hours (rendered under a time budget), silent Generate
                streams to the engine and silent Upload streams to the preprocessor that declare large tensors,
                oversized uploads. Prints both p99 latencies and their ratio (target: within 2x) and what
                each kind of hostile request was answered.

bench/faults.py runs them and prints the figures; tests/integration/test_faults.py runs short versions of those no
other test covers and asserts their outcomes (the 2 s and 2x targets are figures, never asserted).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
import torch

from clients import AsyncSpliceClient, SpliceClientError
from splice.v1 import common_pb2, engine_pb2, engine_pb2_grpc
from tests.harness.soak import SoakResult, soak
from tests.harness.up import Up

LONG = {"temperature": 0.0, "max_tokens": 1500, "ignore_eos": True}
HI = [{"role": "user", "content": "Hi"}]
HOSTILE_TEMPLATE = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"
# The stack's limits, small enough that the hostile requests below reach them quickly.
TEMPLATE_TIMEOUT, IDLE_TIMEOUT, MAX_EMBEDS_BYTES = 1.0, 5.0, 8 << 20
ENGINE_ARGS = f"--max-running-seqs 16 --upload-idle-timeout {IDLE_TIMEOUT:g}"
PREPROCESSOR_ARGS = (f"--trust-request-chat-template --chat-template-timeout {TEMPLATE_TIMEOUT:g} "
                     f"--chat-template-workers 2 --upload-idle-timeout {IDLE_TIMEOUT:g} "
                     f"--max-embeds-bytes {MAX_EMBEDS_BYTES}")
MiB = 1 << 20


def start_up(*extra: str) -> Up:
    """`splice up` on free ports with the limits above; returns once it serves."""
    up = Up("--port", "0", "--engine-port", "0", "--http-port", "0", "--engine-args", ENGINE_ARGS,
            "--preprocessor-args", PREPROCESSOR_ARGS, *extra)
    try:
        up.wait_ready()
    except BaseException:
        up.kill()
        raise
    return up


@dataclass
class Outcome:
    name: str
    figures: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # outcomes that did not hold

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def report(self) -> str:
        verdict = "ok" if not self.problems else "FAILED: " + "; ".join(self.problems)
        return "\n".join([f"[{self.name}] {verdict}", *(f"  {f}" for f in self.figures)])


async def _long_streams(address: str, n: int) -> list[tuple[AsyncSpliceClient, object]]:
    """`n` long greedy streams that have each received their first chunk."""
    streams = []
    for i in range(n):
        client = AsyncSpliceClient(address, timeout=300)
        stream = client.chat([{"role": "user", "content": f"Tell me long story number {i}."}], **LONG)
        await anext(stream)
        streams.append((client, stream))
    return streams


async def _ends(streams, since: float) -> list[tuple[str, float]]:
    """(status name, seconds since `since`) for how each stream ended."""
    async def one(client, stream) -> tuple[str, float]:
        try:
            async for _ in stream:
                pass
            code = "OK"
        except SpliceClientError as exc:
            code = exc.code.name
        finally:
            await client.close()
        return code, time.monotonic() - since

    return await asyncio.gather(*(one(c, s) for c, s in streams))


async def _short(address: str, timeout: float = 30.0) -> tuple[str, float]:
    """A short greedy chat: (status name, seconds)."""
    began = time.monotonic()
    try:
        async with AsyncSpliceClient(address, timeout=timeout) as client:
            chunks = [c async for c in client.chat(HI, temperature=0.0, max_tokens=4)]
        code = "OK" if chunks[-1].finish_reason else "NO_FINISH"
    except SpliceClientError as exc:
        code = exc.code.name
    return code, time.monotonic() - began


async def _until_served(address: str, limit: float = 120.0) -> tuple[float, collections.Counter]:
    """Seconds until a short chat succeeds (retrying every 0.2 s), and the codes seen before."""
    began, seen = time.monotonic(), collections.Counter()
    while time.monotonic() - began < limit:
        code, _ = await _short(address, timeout=10)
        if code == "OK":
            return time.monotonic() - began, seen
        seen[code] += 1
        await asyncio.sleep(0.2)
    return float("inf"), seen


def _codes(ends: list[tuple[str, float]]) -> str:
    return ", ".join(f"{code} x{n}" for code, n in collections.Counter(c for c, _ in ends).items())


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s" if values else "none"


async def _kill_and_return(up: Up, name: str, n: int, out: Outcome) -> None:
    """`n` long streams, then `kill -9` of `name`: the streams must end UNAVAILABLE, `splice up` must restart it
    and a request must be served again. Its figures and checks go to `out`."""
    streams = await _long_streams(up.address, n)
    pid, mark = up.child(name)[0], len(up.lines)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    ends = await _ends(streams, killed)
    line = await asyncio.to_thread(up.read_until, f"splice up: {name} serving again", 120, mark)
    restarted = time.monotonic() - killed
    served, seen = await _until_served(up.address)
    out.figures += [f"{n} running streams ended {_codes(ends)} after {_spread([t for _, t in ends])} (target < 2 s)",
                    f"splice up restarted the {name} after {restarted:.1f} s: {line.strip()}",
                    f"next request served {served + restarted:.1f} s after the kill (before that: {dict(seen)})"]
    out.check(all(c == "UNAVAILABLE" for c, _ in ends), f"streams ended {_codes(ends)}")
    out.check(all(t < 2.0 for _, t in ends), "a stream saw UNAVAILABLE only after 2 s")
    out.check(served < float("inf"), "not served again")


async def kill9(up: Up, n: int) -> Outcome:
    out = Outcome("engine kill -9")
    await _kill_and_return(up, "engine", n, out)
    return out


async def sigstop(up: Up, n: int) -> Outcome:
    out = Outcome("engine SIGSTOP / SIGCONT")
    streams = await _long_streams(up.address, n)
    pid = up.child("engine")[0]
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(0.5)
        fresh = asyncio.create_task(_short(up.address, timeout=30))  # a new request while the engine is frozen
        ends = await asyncio.wait_for(_ends(streams, stopped), 120)
        new_code, new_s = await fresh
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    served, seen = await _until_served(up.address)
    same = up.child("engine")[0] == pid
    out.figures += [f"{n} running streams ended {_codes(ends)} after {_spread([t for _, t in ends])} "
                    f"(keepalive finds the frozen engine)",
                    f"a request sent 0.5 s into the freeze: {new_code} after {new_s:.1f} s",
                    f"SIGCONT {resumed - stopped:.1f} s after SIGSTOP; served again {served:.1f} s later "
                    f"(before that: {dict(seen)}); same engine process: {same}"]
    out.check(all(c == "UNAVAILABLE" for c, _ in ends), f"streams ended {_codes(ends)}")
    out.check(new_code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), f"a request during the freeze got {new_code}")
    out.check(served < float("inf") and same, "not served again by the same engine")
    return out


async def preprocessor(up: Up, n: int) -> Outcome:
    out = Outcome("preprocessor kill -9")
    before = sorted([(await _short(up.address))[1] for _ in range(5)])
    await _kill_and_return(up, "preprocessor", n, out)
    after = sorted([(await _short(up.address))[1] for _ in range(5)])
    out.figures.append(f"a short chat: {statistics.median(before) * 1000:.0f} ms before the kill, "
                       f"{statistics.median(after) * 1000:.0f} ms after (median of 5; the {n} cut streams of "
                       f"{LONG['max_tokens']} tokens would slow it if they still ran)")
    return out


# --- hostile traffic -------------------------------------------------------------------------------------------

@dataclass
class Hostile:
    codes: collections.Counter = field(default_factory=collections.Counter)  # status name -> answers
    seconds: list[float] = field(default_factory=list)  # how long each took to be answered

    def report(self) -> str:
        codes = ", ".join(f"{c} x{n}" for c, n in self.codes.items())
        return f"{codes}; answered after {_spread(self.seconds)}"


async def _forever(stop: asyncio.Event, record: Hostile, attempt: Callable[[], Awaitable[str]]) -> None:
    while not stop.is_set():
        began = time.monotonic()
        code = await attempt()
        if not stop.is_set():  # not the ones cut short by the end of the run
            record.codes[code] += 1
            record.seconds.append(time.monotonic() - began)


async def _template_workers_ready(address: str) -> None:
    """Waits until a harmless request template renders. A render sent before the template workers' first start
    is timed from that start, and a preprocessor splice up has just restarted starts its workers niced: on a loaded
    machine that can take longer than the scenario runs, and the hostile templates would go unanswered in it."""
    while True:
        try:
            async with AsyncSpliceClient(address, timeout=120) as client:
                _ = [c async for c in client.chat(HI, chat_template="{% for m in messages %}{{ m['content'] }}"
                                                  "{% endfor %}", max_tokens=1)]
            return
        except SpliceClientError as exc:
            if exc.code != grpc.StatusCode.RESOURCE_EXHAUSTED:  # (busy workers say "try again")
                raise


async def _template(address: str) -> str:
    try:
        async with AsyncSpliceClient(address, timeout=30) as client:
            _ = [c async for c in client.chat(HI, chat_template=HOSTILE_TEMPLATE, max_tokens=1)]
        return "OK"
    except SpliceClientError as exc:
        return exc.code.name


async def _silent(call) -> str:
    """Awaits the end of a call whose request stream went silent: its status name."""
    try:
        _ = [r async for r in call]
        return "OK"
    except grpc.aio.AioRpcError as exc:
        return exc.code().name


async def _silent_generate(engine: str, hidden: int, nbytes: int, stop: asyncio.Event) -> str:
    """A Generate stream to the engine that declares a prompt_embeds tensor of `nbytes` and sends nothing."""
    rows = nbytes // (4 * hidden)
    header = engine_pb2.GenerateHeader(
        request_id="silent", token_ids=[1, 1, 1], embed_spans=[common_pb2.EmbedSpan(offset=1, length=1)],
        tensors=[engine_pb2.TensorMeta(name="prompt_embeds", dtype="float32", shape=[rows, hidden])],
        sampling=common_pb2.SamplingParams(max_tokens=1))

    async def parts():
        yield engine_pb2.GenerateRequestPart(header=header)
        await stop.wait()

    async with grpc.aio.insecure_channel(engine) as channel:
        return await _silent(engine_pb2_grpc.EngineStub(channel).Generate(parts(), timeout=120))


async def _silent_upload(address: str, hidden: int, parts: int, stop: asyncio.Event) -> str:
    """An Upload stream to the preprocessor that declares `parts` prompt_embeds tensors of MAX_EMBEDS_BYTES and
    then sends nothing."""
    from splice.v1 import preprocessor_pb2 as pp

    rows = MAX_EMBEDS_BYTES // (4 * hidden)
    embeds = pp.ContentPart(prompt_embeds=pp.PromptEmbeds(tensor=common_pb2.Tensor(dtype="float32",
                                                                                    shape=[rows, hidden])))
    first = pp.UploadPart(chat=pp.ChatRequest(messages=[pp.ChatMessage(role="user", content=[embeds] * parts)]))

    async def stream():
        yield first
        await stop.wait()

    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream("/splice.v1.Preprocessor/Upload",
                                     request_serializer=pp.UploadPart.SerializeToString)(stream(), timeout=120)
        return await _silent(call)


async def _oversized(address: str, hidden: int) -> str:
    """prompt_embeds twice --max-embeds-bytes, through the client (which streams it as an Upload)."""
    rows = 2 * MAX_EMBEDS_BYTES // (4 * hidden)
    try:
        async with AsyncSpliceClient(address, timeout=60) as client:
            content = [{"type": "prompt_embeds", "prompt_embeds": torch.zeros(rows, hidden)},
                       {"type": "text", "text": "hi"}]
            _ = [c async for c in client.chat([{"role": "user", "content": content}], max_tokens=1)]
        return "OK"
    except SpliceClientError as exc:
        return exc.code.name


async def hostile(up: Up, workers: int, seconds: float) -> Outcome:
    out = Outcome("hostile traffic beside normal traffic")
    async with AsyncSpliceClient(up.address, timeout=30) as client:
        hidden = (await client.model_info()).hidden_size
    await _template_workers_ready(up.address)
    clean = await soak(up.address, workers, seconds, seed=1)
    stop = asyncio.Event()
    template, generate, upload, oversized = ("request template (runs for hours)", "silent Generate declaring 1 GiB",
                                             "silent Upload declaring 256 MiB", "oversized prompt_embeds (2x the cap)")
    kinds = {name: Hostile() for name in (template, generate, upload, oversized)}
    # Four silent Generate streams declaring 1 GiB each, the engine's whole 4 GiB tensor
    # budget; silent Upload streams declaring the preprocessor's whole 1 GiB of request bytes. Both hold only
    # what they sent (nothing) until the idle timeout abandons them.
    hostile_tasks = [
        *(_forever(stop, kinds[template], lambda: _template(up.address)) for _ in range(2)),
        *(_forever(stop, kinds[generate], lambda: _silent_generate(up.engine_address, hidden, 1024 * MiB, stop))
          for _ in range(4)),
        *(_forever(stop, kinds[upload], lambda: _silent_upload(up.address, hidden, 32, stop)) for _ in range(4)),
        _forever(stop, kinds[oversized], lambda: _oversized(up.address, hidden)),
    ]
    running = [asyncio.create_task(t) for t in hostile_tasks]
    try:
        await asyncio.sleep(1.0)  # the silent streams hold their declarations before normal traffic starts
        loaded = await soak(up.address, workers, seconds, seed=2)
    finally:
        stop.set()
        await asyncio.wait(running, timeout=60)
    ratio = _p99(loaded) / _p99(clean)
    out.figures += [f"normal traffic ({workers} streams x {seconds:g} s, mixed text / embeds / images):",
                    f"  clean:   {_summary(clean)}", f"  hostile: {_summary(loaded)}",
                    f"  p99 hostile / clean = {ratio:.2f} (target <= 2)"]
    out.figures += [f"{kind}: {record.report()}" for kind, record in kinds.items()]
    for result, name in ((clean, "clean"), (loaded, "hostile")):
        out.check(not result.errors and not result.mismatches, f"{name} normal traffic: "
                  f"{(result.errors + result.mismatches)[:3]}")
    out.check(all({"OK", "UNKNOWN", "INTERNAL"}.isdisjoint(r.codes) for r in kinds.values()),
              "a hostile request was served or crashed a path")
    out.check(all(r.codes for r in kinds.values()),
              "a kind of hostile request was never answered")
    return out


def _p99(result: SoakResult) -> float:
    return statistics.quantiles(result.latencies, n=100)[98]


def _summary(result: SoakResult) -> str:
    lat = result.latencies
    return (f"{len(lat)} requests, p50 {statistics.median(lat) * 1000:.0f} ms, p99 {_p99(result) * 1000:.0f} ms, "
            f"{result.tokens / result.seconds:.0f} tok/s, errors {len(result.errors) + len(result.mismatches)}")


SCENARIOS = ("kill9", "sigstop", "preprocessor", "hostile")


async def run(only: tuple[str, ...], streams: int, seconds: float) -> list[Outcome]:
    outcomes = []
    up = await asyncio.to_thread(start_up)
    try:
        for name in only:
            if name == "hostile":
                outcome = await hostile(up, streams, seconds)
            else:
                outcome = await {"kill9": kill9, "sigstop": sigstop, "preprocessor": preprocessor}[name](up, streams)
            print(outcome.report(), flush=True)
            outcomes.append(outcome)
        code = up.stop()
        if code != 0:
            outcomes.append(Outcome("splice up stop", problems=[f"exit code {code}"]))
    finally:
        up.kill()
    return outcomes
