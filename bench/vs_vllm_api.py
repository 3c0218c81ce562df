"""vLLM and Splice side by side on the same weights: the same requests (bench/vllm_corpus.py: chat and completions,
streamed and not, logprobs, stop strings and stop_token_ids, grammars, n, echo, token IDs, prompt embeddings, the
other routes, requests to refuse) go to both, and their answers are compared field by field: text, finish and stop
reasons, usage, logprobs within 1e-4, status, the error's code / type / param, and the keys of every object (values
of ids, timestamps, system_fingerprint and error messages are not compared). A streamed answer is compared joined:
each choice's text, logprobs and reasons, its usage, and the keys of its first, usual, final and usage chunks.

Prints one row per difference (case, where, vLLM's, Splice's) and a summary; exit status 1 when any differ. Needs vLLM
in its own virtual environment (--vllm-venv; never a dependency of Splice), so it is not part of CI.

    .venv/bin/python -m bench.vs_vllm_api --vllm-venv VLLM_VENV
    .venv/bin/python -m bench.vs_vllm_api --vllm-url http://127.0.0.1:8001 --splice-url http://127.0.0.1:8000

Both are started on the same folder (--model: a Splice name or folder), float32, a 2048-token context, served as
--served-model-name; vLLM with --enable-prompt-embeds (Splice serves them without a flag); with --tool-call-parser,
both with that tool parser and auto tool choice. vLLM's first start on a CPU compiles for ~2 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.vllm_corpus import Case, corpus
from bench.vllm_server import check_venv, vllm_server

TOLERANCE = 1e-4
# values that differ by nature: ids, clocks, the server's name and version
IGNORED = {"id", "created", "system_fingerprint", "owned_by"}
WIDTH = 44


# -- the servers ----------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def splice_server(model: str, name: str, flags: list[str]) -> Iterator[str]:
    from app.launch import start_stack
    from app.models import resolve_model

    print("starting Splice ...", flush=True)
    folder = resolve_model(model, progress=print)  # the --model vLLM gets: the same `root` in /v1/models
    engine, pre = start_stack(folder, http_port=0, engine_args=["--max-model-len", "2048"],
                              preprocessor_args=["--served-model-name", name, *flags])
    try:
        yield f"http://{pre.http_address}"
    finally:
        pre.stop()
        engine.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- asking ---------------------------------------------------------------------------------------------------------

def _served(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


def ask(client: httpx.Client, url: str, model: str, case: Case) -> tuple[int, object]:
    """(status, the JSON answer; a stream's joined by `joined`)."""
    if case.body is None:
        response = client.get(url + case.path)
        return response.status_code, response.json()
    if "__raw__" in case.body:
        response = client.post(url + case.path, content=case.body["__raw__"],
                               headers={"Content-Type": "application/json"})
        return response.status_code, _json(response.text)
    body = {"model": model, **case.body} if case.path.startswith("/v1/") else dict(case.body)
    if not case.stream:
        response = client.post(url + case.path, json=body)
        return response.status_code, _json(response.text)
    with client.stream("POST", url + case.path, json=body) as response:
        if response.status_code != 200:
            return response.status_code, _json(response.read().decode())
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    return 200, joined(events)


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return {"(not JSON)": text[:200]}


def key_paths(value: object, path: str = "") -> set[str]:
    """Every key of `value` as a dotted path, list items as []."""
    if isinstance(value, dict):
        out = set()
        for k, v in value.items():
            p = f"{path}.{k}" if path else k
            out |= {p} | key_paths(v, p)
        return out
    if isinstance(value, list):
        return set().union(*(key_paths(v, f"{path}[]") for v in value)) if value else set()
    return set()


def _kind(event: dict, first: bool) -> str:
    if "error" in event:
        return "error"
    if not event.get("choices"):
        return "usage chunk"
    if first:
        return "first chunk"
    if any(c.get("finish_reason") for c in event["choices"]):
        return "final chunk"
    return "chunk"


def joined(events: list[dict]) -> dict:
    """A stream as one object: per choice its text, logprobs, reasons and token IDs; the usage; the errors; and the
    keys of each kind of chunk."""
    keys: dict[str, set[str]] = {}
    choices: dict[str, dict] = {}
    out: dict = {"choices": choices, "usage": None, "errors": []}
    for i, event in enumerate(events):
        keys.setdefault(_kind(event, i == 0), set()).update(key_paths(event))
        if "error" in event:
            out["errors"].append(event["error"])
            continue
        if event.get("usage"):
            out["usage"] = event["usage"]
        for c in event.get("choices", []):
            choice = choices.setdefault(str(c["index"]), {"text": "", "logprobs": None, "finish_reason": None,
                                                          "stop_reason": None, "token_ids": None,
                                                          "prompt_token_ids": None})
            delta = c.get("delta")
            choice["text"] += (delta.get("content") if delta is not None else c.get("text")) or ""
            if delta and delta.get("tool_calls"):
                choice.setdefault("tool_calls", []).extend(delta["tool_calls"])
            for name in ("finish_reason", "stop_reason"):
                if c.get(name) is not None:
                    choice[name] = c[name]
            if c.get("token_ids") is not None:
                choice["token_ids"] = (choice["token_ids"] or []) + c["token_ids"]
            if event.get("usage"):  # continuous_usage_stats: the choice's last usage so far
                choice["usage so far"] = event["usage"]
            prompt_ids = c.get("prompt_token_ids") or event.get("prompt_token_ids")
            if prompt_ids is not None:
                choice["prompt_token_ids"] = prompt_ids
            if c.get("logprobs"):
                choice["logprobs"] = _join_logprobs(choice["logprobs"], c["logprobs"])
    out["keys"] = {kind: sorted(paths) for kind, paths in keys.items()}
    return out


def _join_logprobs(have: dict | None, more: dict) -> dict:
    if have is None:
        return json.loads(json.dumps(more))
    for name, items in more.items():
        if isinstance(items, list):
            have[name] = (have.get(name) or []) + items
    return have


# -- comparing ------------------------------------------------------------------------------------------------------

def _short(value: object) -> str:
    text = value if isinstance(value, str) and value.startswith("(") else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= WIDTH else text[:WIDTH - 1] + "…"


def diff(a: object, b: object, path: str = "") -> Iterator[tuple[str, str, str]]:
    """(where, vLLM's, Splice's) for each difference of `b` from `a`."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                yield p, "(no key)" if k not in a else _short(a[k]), "(no key)" if k not in b else _short(b[k])
            elif k in IGNORED or (k == "message" and path.endswith("error")):
                continue
            elif k == "param" and path.endswith("error") and a[k] is None:
                continue  # vLLM names no field: Splice may name the one at fault
            elif path.startswith("keys"):
                only_a, only_b = sorted(set(a[k]) - set(b[k])), sorted(set(b[k]) - set(a[k]))
                if only_a or only_b:
                    yield p, "only: " + ", ".join(only_a) if only_a else "-", "only: " + ", ".join(only_b) \
                        if only_b else "-"
            else:
                yield from diff(a[k], b[k], p)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path} (length)", str(len(a)), str(len(b))
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = list(diff(x, y, f"{path}[{i}]"))
            if found:
                yield from found[:3]
                return  # the first differing item says enough
    elif _number(a) and _number(b):
        if abs(a - b) > TOLERANCE or (isinstance(a, int) and isinstance(b, int) and a != b):
            yield path, _short(a), _short(b)
    elif a != b:
        yield path, _short(a), _short(b)


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def compare(case: Case, vllm: tuple[int, object], splice: tuple[int, object]) -> list[tuple[str, str, str]]:
    (status_a, a), (status_b, b) = vllm, splice
    rows = []
    if status_a != status_b:
        rows.append(("status", str(status_a), str(status_b)))
        if (status_a >= 400) != (status_b >= 400):
            rows.append(("answer", _short(a), _short(b)))
            return rows
    return rows + list(diff(a, b))


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(("case", "where", "vLLM", "Splice"))]
    widths = [min(w, 48) for w in widths]
    line = " | ".join(h.ljust(w) for h, w in zip(("case", "where", "vLLM", "Splice"), widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in rows:
        print(" | ".join(cell[:w].ljust(w) for cell, w in zip(row, widths, strict=True)))


def run(vllm_url: str, splice_url: str, only: str | None, parser: bool) -> int:
    """`parser`: both servers run a tool parser (the cases that need one are asked too)."""
    models = _served(vllm_url), _served(splice_url)
    rows: list[tuple[str, str, str, str]] = []
    cases = [c for c in corpus() if (only is None or only in c.name) and (parser or not c.parser)]
    differing = 0
    with httpx.Client(timeout=300) as client:
        for case in cases:
            found = compare(case, ask(client, vllm_url, models[0], case), ask(client, splice_url, models[1], case))
            differing += bool(found)
            rows += [(case.name, *row) for row in found]
    if rows:
        print_table(rows)
    print(f"\n{len(cases)} cases, {differing} differ ({len(rows)} differences); vLLM serves {models[0]!r}, Splice "
          f"{models[1]!r}")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-venv", help="the virtual environment vLLM is installed in (docs/performance.md)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a Splice model name or a folder")
    parser.add_argument("--served-model-name", default="smollm2-135m-instruct", help="the name both serve it as")
    parser.add_argument("--vllm-url", default=None, help="a vLLM already serving the model (not started here)")
    parser.add_argument("--splice-url", default=None, help="a Splice already serving the model (not started here)")
    parser.add_argument("--vllm-start-timeout", type=float, default=900.0, help="seconds vLLM may take to start")
    parser.add_argument("--only", default=None, help="only the cases whose name holds this text")
    parser.add_argument("--tool-call-parser", default=None, metavar="NAME",
                        help="both servers read tool calls with this parser (vLLM's name, e.g. hermes: the real "
                             "model's template writes <tool_call> JSON) and serve tool_choice auto; adds the tool "
                             "cases")
    args = parser.parse_args()
    if not args.vllm_venv and not args.vllm_url:
        parser.error("give --vllm-venv (vLLM is started from it) or --vllm-url (a vLLM already serving)")
    flags = ["--tool-call-parser", args.tool_call_parser, "--enable-auto-tool-choice"] if args.tool_call_parser \
        else []
    with contextlib.ExitStack() as stack:
        splice_url = args.splice_url or stack.enter_context(splice_server(args.model, args.served_model_name,
                                                                          flags))
        if args.vllm_url:
            vllm_url = args.vllm_url
        else:
            from app.models import resolve_model

            folder = resolve_model(args.model)
            vllm_url = stack.enter_context(vllm_server(check_venv(Path(args.vllm_venv)), folder,
                                                       name=args.served_model_name, port=_free_port(),
                                                       flags=["--enable-prompt-embeds", *flags],
                                                       timeout=args.vllm_start_timeout))
        return run(vllm_url, splice_url, args.only, args.tool_call_parser is not None)


if __name__ == "__main__":
    sys.exit(main())
