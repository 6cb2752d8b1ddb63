#!/usr/bin/env bash
# The demo: GRPO on the embedded default (tiny Qwen2 + arithmetic), on CPU, in about a minute (README).
set -euo pipefail
cd "$(dirname "$0")/.."
RLGRAD_EXTRAS=${RLGRAD_EXTRAS:-none} bash scripts/setup.sh  # the demo needs no extra (nothing to compile)
exec .venv/bin/rlgrad train --config-name demo trainer.experiment_name="demo-$(date +%Y%m%d-%H%M%S)" "$@"
