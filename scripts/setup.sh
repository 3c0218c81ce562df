#!/usr/bin/env bash
# Creates (or reuses) a virtualenv and installs Splice with its test extra.
# VENV=path overrides the location (default .venv). torch is installed first, pinned (TORCH_VERSION), from pip's
# configured indexes, or from TORCH_INDEX when set (e.g. https://download.pytorch.org/whl/cpu: on stock PyPI the
# Linux wheel is the multi-GB CUDA build). A torch already in the venv is kept.
# A line per phase; pip's own output goes to $VENV/splice-install.log, shown whole if pip fails.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
log="$VENV/splice-install.log"
: >"$log"
pip_install() {  # quiet unless it fails; then show why
  "$VENV/bin/python" -m pip install "$@" >>"$log" 2>&1 || { cat "$log" >&2; echo "setup: pip install $* failed (log: $log)" >&2; exit 1; }
}
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: torch already installed in $VENV"
else
  echo "setup: installing torch $TORCH_VERSION (half a minute from a cached wheel; a download of the CUDA build takes longer) ... log: $log"
  pip_install "torch==$TORCH_VERSION" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
fi
echo "setup: installing splice and its dependencies (transformers, grpc, xgrammar, ...: about a minute) ... log: $log"
pip_install -e ".[test]"
# xgrammar asks for triton on Linux x86_64; only a CUDA torch uses it, and beside a CPU torch it prints nanobind
# "leaked" lines at every exit of a process that imported torch._dynamo: a CPU torch's venv goes without it.
if "$VENV/bin/python" -c "import sys, torch; sys.exit(torch.version.cuda is not None)" 2>/dev/null \
   && "$VENV/bin/python" -m pip show triton >/dev/null 2>&1; then
  echo "setup: removing triton: xgrammar installs it for GPU kernels, a CPU torch never runs them, and with it every exit prints nanobind \"leaked\" lines"
  "$VENV/bin/python" -m pip uninstall -y triton >>"$log" 2>&1
fi
echo "setup: done ($VENV/bin/splice)"
