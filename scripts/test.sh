#!/usr/bin/env bash
# The test command: set up the venv, lint, then every test (unit, integration, fidelity).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
bash scripts/setup.sh
"$VENV/bin/ruff" check .
set +e
"$VENV/bin/python" -m pytest -ra "$@"  # -ra: every skip and failure says why
rc=$?
set -e
# pytest exits 5 when it collected nothing; that is a broken suite here, not a pass.
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit "$rc"
