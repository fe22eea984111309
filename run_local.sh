#!/usr/bin/env bash
# Set up .venv if needed, then build TFRecords.
#   ./run_local.sh                          sample images -> ./out, then read a batch back
#   ./run_local.sh --input DIR --output OUT [options]   your own images (see --help)
set -euo pipefail
cd "$(dirname "$0")"
source scripts/venv.sh
ensure_venv transform  # TensorFlow: the read-back below, and --transform

if [ $# -gt 0 ]; then
  exec "$VENV/bin/python" -m beam_pipeline --config configs/local.yaml "$@"
fi

rm -rf sample_data
"$VENV/bin/python" -m beam_pipeline.tools.sample_data sample_data
"$VENV/bin/python" -m beam_pipeline --config configs/local.yaml \
  --input sample_data --output out --name shapes --force \
  --max_error_rate 0.05  # the sample's 3 broken files (of 123) show the dead-letter output
"$VENV/bin/python" -m readers out --split train --batch_size 16
