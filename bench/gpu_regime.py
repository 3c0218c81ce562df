"""The stack's own overhead at GPU speed: whole-stack tok/s over a simulated forward (engine --simulate-forward-ms MS:
each step a wait of MS ms that holds no CPU, as a GPU's forward would, engine/simulate.py) vs the ideal of N tokens
per MS (every stream advancing one token per forward, nothing else costing time), and each process's CPU per token.

    python -m bench.gpu_regime [--model tiny-text] [--ms 10 25] [--streams 64 256 512] [--new-tokens 100]
                               [--procs 4] [--faces grpc http] [--hops multiplex per-call] [--repeats 1]
                               [--no-extras] [--quick]

One stack per MS (engine --max-running-seqs and --max-queue, preprocessor --max-concurrent-requests: at least the
largest N; every other flag at its default). The clients run in PROCS processes of their own (N / PROCS streams
each): gRPC Complete of 16 prompt IDs for NEW_TOKENS tokens (ignore_eos, greedy), or the same over HTTP SSE
(/v1/completions, stream, return_token_ids). A measurement starts once every client process is connected and warm,
and ends with the last token. CPU per token: utime + stime of the engine and preprocessor processes (/proc, every
thread) and of each client process (getrusage), over the measurement, divided by its tokens; "cores" = all of it
per wall second (this machine has `nproc` of them: at that figure the machine, not the stack, is the bound).

tiny-text by default: its 661-token vocabulary makes the real sampler's argmax cheap, as on a GPU, where the argmax is
part of the forward (on this CPU an argmax over 256 x 49152 logits alone costs ~15 ms, more than MS = 10).

Extras (at the first MS; --no-extras skips them): the stack vs the in-process engine (LLMEngine with the same
simulated forward, driven from this process, no hops) at 64 streams; TTFT added by the hops at concurrency 1
(Complete of max_tokens 1 vs the in-process engine's first token, in turns); ITL p99 of 32 running gRPC streams while
32 streams of 512-token prompts arrive (one every 5 ms, once every running stream has 40 tokens; the intervals
overlapping the window from the first arrival until every arrival has its first token) vs the same streams at the
same token positions with nobody arriving. The simulated prefill charges MS per started 512 prompt positions in a
step (each step prefills up to --mixed-prefill-tokens of them beside the decode), so ITL under arrivals includes
that by design.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import statistics
import time
from contextlib import ExitStack, aclosing
from multiprocessing.connection import Connection

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.common import bench_parser, in_turns_async, prompts, report, spread

PROMPT_LEN = 16
HOPS = {"multiplex": [], "per-call": ["--no-engine-multiplex"]}  # preprocessor flags of each engine hop
QUICK = {"ms": [10.0], "streams": [64], "new_tokens": 20, "repeats": 1, "ttft_requests": 5, "itl_tokens": 80}


# -- CPU ----------------------------------------------------------------------------------------------------------

def process_cpu(pid: int) -> float:
    """utime + stime of process `pid`, every thread, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# -- client processes ---------------------------------------------------------------------------------------------

async def _grpc_streams(target: str, batch: list[list[int]], new_tokens: int, conn: Connection) -> dict:
    from clients import AsyncSpliceClient

    async with AsyncSpliceClient(target, timeout=600) as client:
        async def one(ids: list[int], n: int) -> int:
            return sum([len(c.token_ids) async for c in client.complete([ids], temperature=0.0, ignore_eos=True,
                                                                         max_tokens=n)])

        await one(batch[0], 2)  # connected and warm
        return await _measured(conn, lambda: asyncio.gather(*(one(ids, new_tokens) for ids in batch)))


async def _http_streams(target: str, batch: list[list[int]], new_tokens: int, conn: Connection) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=f"http://{target}", timeout=600, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def one(ids: list[int], n: int) -> int:
            body = {"model": model, "prompt": ids, "max_tokens": n, "stream": True, "ignore_eos": True,
                    "temperature": 0.0, "return_token_ids": True}
            got = 0
            async with client.stream("POST", "/v1/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        got += len(json.loads(line[6:])["choices"][0].get("token_ids") or ())
            return got

        await one(batch[0], 2)
        return await _measured(conn, lambda: asyncio.gather(*(one(ids, new_tokens) for ids in batch)))


async def _measured(conn: Connection, run) -> dict:
    """Says ready, waits for go, runs: its tokens, its CPU seconds and when it started and ended (CLOCK_MONOTONIC is
    one clock for every process of the machine)."""
    loop = asyncio.get_running_loop()
    conn.send("ready")
    await loop.run_in_executor(None, conn.recv)
    cpu, start = own_cpu(), time.monotonic()
    counts = await run()
    return {"tokens": sum(counts), "cpu": own_cpu() - cpu, "start": start, "end": time.monotonic()}


def client_process(conn: Connection) -> None:
    """A client process: runs one measurement per command (face, target, prompts, new tokens) until told None, all
    on one event loop (gRPC's asyncio channels belong to the loop that made them)."""
    asyncio.run(_commands(conn))


async def _commands(conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    while (cmd := await loop.run_in_executor(None, conn.recv)) is not None:
        face, target, batch, new_tokens = cmd
        run = _grpc_streams if face == "grpc" else _http_streams
        conn.send(await run(target, batch, new_tokens, conn))


class Clients:
    """PROCS client processes, started once (spawned: none inherits this process's gRPC or threads)."""

    def __init__(self, procs: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(procs):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=client_process, args=(theirs,), daemon=True)
            p.start()
            self.conns.append(ours)
            self.procs.append(p)

    def run(self, face: str, target: str, batch: list[list[int]], new_tokens: int,
            service_pids: dict[str, int]) -> dict:
        """One measurement: the streams of `batch` split over the processes -> tokens, wall seconds, CPU seconds
        per process (the services' and each client's)."""
        k = len(self.conns)
        for i, conn in enumerate(self.conns):
            conn.send((face, target, batch[i::k], new_tokens))
        for conn in self.conns:
            assert conn.recv() == "ready"
        before = {name: process_cpu(pid) for name, pid in service_pids.items()}
        go = time.monotonic()
        for conn in self.conns:
            conn.send("go")
        results = [conn.recv() for conn in self.conns]
        cpu = {name: process_cpu(pid) - before[name] for name, pid in service_pids.items()}
        wall = max(r["end"] for r in results) - go
        tokens = sum(r["tokens"] for r in results)
        assert tokens == len(batch) * new_tokens, (tokens, len(batch), new_tokens)
        return {"tokens": tokens, "wall": wall, "cpu": cpu, "clients": [r["cpu"] for r in results]}

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for p in self.procs:
            p.join(30)


# -- the table ------------------------------------------------------------------------------------------------------

def print_row(ms: float, n: int, face: str, runs: list[dict], hop: str = "") -> None:
    ideal = n * 1000 / ms
    rates = [r["tokens"] / r["wall"] for r in runs]
    per_token = {name: statistics.median(r["cpu"][name] / r["tokens"] * 1e6 for r in runs)
                 for name in runs[0]["cpu"]}
    clients = statistics.median(sum(r["clients"]) / r["tokens"] * 1e6 for r in runs)
    busiest = statistics.median(max(r["clients"]) / r["wall"] for r in runs)
    cores = statistics.median((sum(r["cpu"].values()) + sum(r["clients"])) / r["wall"] for r in runs)
    print(f"MS {ms:g} N {n:>3} {face:>4}{hop}: {spread(rates)} tok/s of ideal {ideal:,.0f} = "
          f"{statistics.median(rates) / ideal:.2f} | CPU us/token: engine {per_token['engine']:.0f}, "
          f"preprocessor {per_token['preprocessor']:.0f}, clients {clients:.0f} ({len(runs[0]['clients'])} procs, "
          f"busiest {busiest:.2f} core) | cores busy {cores:.2f}", flush=True)


# -- extras ---------------------------------------------------------------------------------------------------------

def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))]


async def in_process_rate(engine, batch: list[list[int]], new_tokens: int) -> float:
    from splice.engine_request import EngineRequest
    from splice.sampling import SamplingParams

    sampling = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=new_tokens)

    async def one(i: int, ids: list[int]) -> int:
        return sum([len(o.token_ids) async for o in engine.generate(EngineRequest(f"r{i}", ids, sampling=sampling))])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(batch)))
    assert sum(counts) == len(batch) * new_tokens
    return sum(counts) / (time.perf_counter() - start)


async def itl_run(client, running: list[list[int]], arriving: list[list[int]], tokens: int,
                  window: tuple[list[int], list[int]] | None) -> tuple[list[float], tuple[list[int], list[int]]]:
    """RUNNING gRPC streams of `tokens` tokens; ARRIVING ones (if `window` is None) one every 5 ms once every running
    stream has 40 tokens -> (the intervals in ms between consecutive tokens of the running streams inside the
    window, the window as each stream's (first, last) token index). With a `window` given, nobody arrives and the
    intervals at those token indexes are taken (the baseline)."""
    stamps: list[list[float]] = [[] for _ in running]
    ready = asyncio.Event()
    span: list[float] = []

    async def run(i: int, ids: list[int]) -> None:
        async with aclosing(client.complete([ids], temperature=0.0, ignore_eos=True, max_tokens=tokens)) as chunks:
            async for c in chunks:
                stamps[i] += [time.perf_counter()] * len(c.token_ids)
                if all(len(s) >= 40 for s in stamps):
                    ready.set()

    async def arrive() -> None:
        await ready.wait()
        span.append(time.perf_counter())

        async def one(ids: list[int]) -> None:
            async with aclosing(client.complete([ids], temperature=0.0, ignore_eos=True, max_tokens=4)) as chunks:
                async for _ in chunks:
                    return

        tasks = []
        for ids in arriving:
            tasks.append(asyncio.ensure_future(one(ids)))
            await asyncio.sleep(0.005)
        await asyncio.gather(*tasks)
        span.append(time.perf_counter())

    await asyncio.gather(*(run(i, ids) for i, ids in enumerate(running)), *([] if window else [arrive()]))
    if window is None:
        first = [next((k for k, t in enumerate(s) if t >= span[0]), len(s) - 1) for s in stamps]
        last = [next((k for k, t in enumerate(s) if t >= span[1]), len(s) - 1) for s in stamps]
        window = (first, last)
    gaps = [(s[k] - s[k - 1]) * 1e3 for s, a, b in zip(stamps, *window, strict=True) for k in range(max(a, 1), b + 1)]
    return gaps, window


async def extras(args: argparse.Namespace, ms: float, folder: str, pre, clients: Clients, pids: dict) -> None:
    import torch

    from clients import AsyncSpliceClient
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from splice.engine_request import EngineRequest
    from splice.sampling import SamplingParams

    torch.set_num_threads(1)
    engine = LLMEngine(EngineConfig(model=folder, simulate_forward_ms=ms, max_running_seqs=max(args.streams),
                                    max_queue=max(args.streams)))
    engine.start()
    try:
        await engine.warmup()
        batch = prompts(64, seed=5, lengths=(PROMPT_LEN, PROMPT_LEN))

        async def stack() -> float:
            r = await asyncio.to_thread(clients.run, "grpc", pre.address, batch, args.new_tokens, pids)
            return r["tokens"] / r["wall"]

        rates = await in_turns_async({"stack": stack, "engine": lambda: in_process_rate(engine, batch,
                                                                                          args.new_tokens)},
                                     args.repeats)
        report(f"MS {ms:g}, 64 streams: stack (gRPC, clients in {args.procs} processes) vs the in-process engine",
               rates["stack"], rates["engine"], "tok/s")

        async with AsyncSpliceClient(pre.address, timeout=600) as client:
            ids = prompts(1, seed=6, lengths=(PROMPT_LEN, PROMPT_LEN))[0]
            one = SamplingParams(temperature=0.0, max_tokens=1)

            async def hops() -> float:
                start = time.perf_counter()
                async with aclosing(client.complete([ids], temperature=0.0, max_tokens=1)) as chunks:
                    async for _ in chunks:
                        return (time.perf_counter() - start) * 1e3
                raise RuntimeError("no chunk")

            async def direct() -> float:
                start = time.perf_counter()
                async with aclosing(engine.generate(EngineRequest("ttft", ids, sampling=one))) as outs:
                    async for _ in outs:
                        return (time.perf_counter() - start) * 1e3
                raise RuntimeError("no output")

            await in_turns_async({"hops": hops, "direct": direct}, 3)  # warm
            ttft = await in_turns_async({"hops": hops, "direct": direct}, args.ttft_requests)
            added = [a - b for a, b in zip(ttft["hops"], ttft["direct"], strict=True)]
            print(f"MS {ms:g}: TTFT at concurrency 1 through both hops {spread(ttft['hops'])} ms vs in-process "
                  f"{spread(ttft['direct'])} ms; added by the hops {spread(added)} ms (n={len(added)})", flush=True)

            ours, base = [], []
            for k in range(args.repeats):
                running = prompts(32, seed=100 + k, lengths=(PROMPT_LEN, 64))
                arriving = prompts(32, seed=200 + k, lengths=(512, 512))
                gaps, window = await itl_run(client, running, arriving, args.itl_tokens, None)
                quiet, _ = await itl_run(client, running, [], args.itl_tokens, window)
                ours.append(p99(gaps))
                base.append(p99(quiet))
            report(f"MS {ms:g}: ITL p99 of 32 running streams while 32 x 512-token prompts arrive vs nobody arriving",
                   ours, base, "ms")
    finally:
        engine.stop()


# -- main -----------------------------------------------------------------------------------------------------------

async def main() -> None:
    parser = bench_parser(__doc__, quick=QUICK, repeats=1, ms=[10.0, 25.0], streams=[64, 256, 512], new_tokens=100,
                          procs=4, faces=["grpc", "http"], ttft_requests=20, itl_tokens=200)
    parser.add_argument("--no-extras", action="store_true", help="only the table")
    parser.add_argument("--hops", nargs="+", choices=list(HOPS), default=["multiplex"],
                        help="the preprocessor's engine hop: one Multiplex stream (the default), and/or one call per "
                             "request (--no-engine-multiplex), each a stack of its own, measured in turns")
    args = parser.parse_args()
    from app.models import resolve_model
    from bench.stacks import running_stack

    folder = str(resolve_model(args.model))
    most = max(args.streams)
    clients = Clients(args.procs)
    try:
        for ms in args.ms:
            engine_args = ["--simulate-forward-ms", str(ms), "--max-running-seqs", str(most), "--max-queue", str(most)]
            pre_args = ["--max-concurrent-requests", str(2 * most + 64)]
            with ExitStack() as stacks:
                up = {hop: stacks.enter_context(running_stack(args.model, http_port=0, engine_args=engine_args,
                                                              preprocessor_args=pre_args + HOPS[hop]))
                      for hop in args.hops}
                for n in args.streams:
                    batch = prompts(n, seed=n, lengths=(PROMPT_LEN, PROMPT_LEN))
                    for face in args.faces:
                        runs: dict[str, list[dict]] = {hop: [] for hop in up}
                        for _ in range(args.repeats):  # in turns: the machine's drift hits every variant alike
                            for hop, (engine, pre) in up.items():
                                pids = {"engine": engine.proc.pid, "preprocessor": pre.proc.pid}
                                target = pre.address if face == "grpc" else pre.http_address
                                runs[hop].append(clients.run(face, target, batch, args.new_tokens, pids))
                        for hop in up:
                            print_row(ms, n, face, runs[hop], f" {hop}" if len(up) > 1 else "")
                engine, pre = up[args.hops[0]]
                if not args.no_extras and ms == args.ms[0]:
                    await extras(args, ms, folder, pre, clients,
                                 {"engine": engine.proc.pid, "preprocessor": pre.proc.pid})
    finally:
        clients.close()
    print(f"({args.model}, {args.new_tokens} tokens per stream, {PROMPT_LEN} prompt IDs, clients in {args.procs} "
          f"processes, this machine: {os.cpu_count()} CPUs)", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
