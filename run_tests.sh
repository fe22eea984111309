#!/usr/bin/env bash
# Create/update .venv with the test extras and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/venv.sh
ensure_venv test
export TF_CPP_MIN_LOG_LEVEL=2
exec "$VENV/bin/python" -m pytest "$@"
