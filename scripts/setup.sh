#!/usr/bin/env bash
# Creates (or reuses) a virtualenv and installs Splice with its test extra.
# VENV=path overrides the location (default .venv). torch is pinned to the CPU build that pip finds
# locally; an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install -q -e ".[test]"
