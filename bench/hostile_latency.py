"""Another user's latency while one hostile request of issue 40 is served: a probe sends a small chat request (2
tokens) after another, and each hostile input is sent once per repeat beside it; printed per input: the hostile
request's own time and status, and the probe's worst latency while the hostile one was in flight, beside the probe's
worst latency over an equal clean stretch measured just before (ratio per repeat). The event loop serves every
client: a hostile request whose work ran on it showed as seconds of probe latency.

    python -m bench.hostile_latency [--only deep_spec,tools,logit_bias,allowed_ids,valid_tools,whole_answer]
                                    [--repeats 3] [--bias-entries 2000000] [--quick]

Inputs (tiny-text, HTTP): deep_spec = guided_json nested 1000 deep (row 6); tools = 60,000 tools, tool_choice none
(row 7); logit_bias = BIAS_ENTRIES entries (row 8); allowed_ids = 10M allowed_token_ids (row 8b); valid_tools = 1024
valid tools (the cap), checked then refused as too long; whole_answer = n 32 x 1000 tokens with 20 logprobs each, not
streamed (row 14).
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable

import httpx

from bench.common import bench_parser, spread
from bench.stacks import running_stack

HI = [{"role": "user", "content": "Hi"}]


def _body(fields: dict) -> bytes:
    return json.dumps({"messages": HI, "max_tokens": 2, **fields}).encode()


def _inputs(bias_entries: int, ids: int, choices: int) -> dict[str, Callable[[], bytes]]:
    def valid_tools() -> bytes:
        props = {f"p{i}": {"type": "string", "description": "a field " * 4} for i in range(12)}
        return _body({"tool_choice": "none", "tools": [{"type": "function", "function": {
            "name": f"f{i}", "description": "a tool " * 8, "parameters": {"type": "object", "properties": props}}}
            for i in range(1024)]})

    return {
        "deep_spec": lambda: _body({"guided_json": '{"items":' * 1000 + "{}" + "}" * 1000}),
        "tools": lambda: _body({"tool_choice": "none", "tools": [{"type": "function", "function": {
            "name": f"f{i}", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}
            for i in range(60_000)]}),
        "logit_bias": lambda: (b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logit_bias": {'
                               + b",".join(b'"%d": 1.0' % i for i in range(bias_entries)) + b"}}"),
        "allowed_ids": lambda: (b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, '
                                b'"allowed_token_ids": [' + b",".join([b"1"] * ids) + b"]}"),
        "valid_tools": valid_tools,
        "whole_answer": lambda: _body({"max_tokens": 1000, "n": choices, "ignore_eos": True, "logprobs": True,
                                       "top_logprobs": 20}),
    }


class Probe:
    """Small requests one after another, each latency kept with its start time."""

    def __init__(self, base: str) -> None:
        self.base, self.samples = base, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=600) as http:
            while not self._stop.is_set():
                start = time.monotonic()
                http.post("/v1/chat/completions", content=_body({}), headers={"content-type": "application/json"})
                self.samples.append((start, time.monotonic() - start))

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def worst(self, start: float, end: float) -> float:
        """The worst latency of the probes in flight between `start` and `end`, once each has finished (a probe
        held by a stall finishes after it)."""
        while not self.samples or self.samples[-1][0] <= end:
            time.sleep(0.01)
        inside = [lat for t, lat in self.samples if t <= end and t + lat >= start]
        return max(inside, default=0.0)


def main() -> int:
    names = list(_inputs(0, 0, 0))
    parser = bench_parser(__doc__, quick={"repeats": 1, "bias_entries": 200_000, "ids": 1_000_000, "choices": 4},
                          bias_entries=2_000_000, ids=10_000_000, choices=32)
    parser.add_argument("--only", default=",".join(names), help=f"comma-separated, of {names}")
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n]
    if unknown := set(only) - set(names):
        parser.error(f"unknown inputs {sorted(unknown)}")
    inputs = _inputs(args.bias_entries, args.ids, args.choices)
    with running_stack(args.model, http_port=0, preprocessor_args=["--tool-call-parser", "hermes",
                                                                   "--enable-auto-tool-choice"]) as (_, pre):
        base = f"http://{pre.http_address}"
        with Probe(base) as probe, httpx.Client(base_url=base, timeout=600) as http:
            for name in only:
                body = inputs[name]()
                hostile, clean, took, statuses = [], [], [], set()
                for _ in range(args.repeats):
                    start = time.monotonic()
                    response = http.post("/v1/chat/completions", content=body,
                                         headers={"content-type": "application/json"})
                    end = time.monotonic()
                    statuses.add(response.status_code)
                    took.append(end - start)
                    hostile.append(probe.worst(start, end))
                    calm = time.monotonic()
                    time.sleep(max(end - start, 0.5))  # an equal clean stretch after it
                    clean.append(probe.worst(calm, time.monotonic()))
                ratios = [h / c for h, c in zip(hostile, clean, strict=True) if c]
                print(f"{name}: {len(body) / 1e6:.1f} MB, status {sorted(statuses)}, its own time {spread(took)} s; "
                      f"another user's worst latency during it {spread(hostile)} s | clean {spread(clean)} s | "
                      f"ratio {spread(ratios) if ratios else '-'}", flush=True)
        print(f"probe p50 over the run: {statistics.median(lat for _, lat in probe.samples):.3f} s "
              f"({len(probe.samples)} requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
