#!/usr/bin/env bash
# The main command: set up the venv, then run the seed scenario on the built-in tiny VLM.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
bash scripts/setup.sh
exec "$VENV/bin/splice" demo "$@"
