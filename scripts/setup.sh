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
log="$VENV/splice-install.log"
pip_install() {  # quiet unless it fails; then show why
  "$VENV/bin/python" -m pip install "$@" >"$log" 2>&1 || { cat "$log" >&2; echo "pip install $* failed" >&2; exit 1; }
}
"$VENV/bin/python" -c "import torch" 2>/dev/null || pip_install "torch==$TORCH_VERSION"
pip_install -e ".[test]"
