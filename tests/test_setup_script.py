"""scripts/setup.sh as a new user watches it: a line per phase naming the log, pip's output kept in the log, all
of it shown when pip fails. A stand-in venv python records the calls instead of installing anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../calls"
if [ "$1" = "-c" ]; then exit 1; fi   # import torch: not yet installed
echo "Collecting pip noise for $*"
if [ -n "${FAIL_ON:-}" ] && [[ "$*" == *"$FAIL_ON"* ]]; then echo "ERROR: no matching distribution"; exit 1; fi
"""


def _venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(SHIM)
    (venv / "bin" / "python").chmod(0o755)
    return venv


def _setup(venv: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "VENV": str(venv), **env})


def test_setup_prints_a_line_per_phase_and_keeps_pip_in_its_log(tmp_path):
    venv = _venv(tmp_path)
    out = _setup(venv)
    assert out.returncode == 0, out.stderr
    log = venv / "splice-install.log"
    assert out.stdout.splitlines() == [
        f"setup: installing torch 2.13.0 (half a minute from a cached wheel; a download of the CUDA build takes "
        f"longer) ... log: {log}",
        f"setup: installing splice and its dependencies (transformers, grpc, xgrammar, ...: about a minute) ... log: "
        f"{log}",
        f"setup: done ({venv}/bin/splice)"]
    assert "pip noise" not in out.stdout + out.stderr
    logged = log.read_text()  # both installs, not only the last
    assert "torch==2.13.0" in logged and "-e .[test]" in logged


def test_a_failed_install_shows_its_log_and_stops(tmp_path):
    venv = _venv(tmp_path)
    out = _setup(venv, FAIL_ON="torch==")
    assert out.returncode == 1
    assert "ERROR: no matching distribution" in out.stderr
    assert out.stderr.splitlines()[-1].startswith("setup: pip install torch==2.13.0 failed (log: ")
    assert "-e .[test]" not in (venv / "calls").read_text()


def test_torch_index_picks_where_torch_comes_from(tmp_path):
    # on stock PyPI the Linux torch wheel is the CUDA build; TORCH_INDEX takes it from PyTorch's CPU index instead
    venv = _venv(tmp_path)
    out = _setup(venv, TORCH_INDEX="https://download.pytorch.org/whl/cpu")
    assert out.returncode == 0, out.stderr
    torch_call, project_call = [c for c in (venv / "calls").read_text().splitlines() if c.startswith("-m pip")]
    assert torch_call == "-m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert "--index-url" not in project_call  # the project's own dependencies come from pip's usual indexes
