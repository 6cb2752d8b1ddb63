#!/usr/bin/env bash
# The test command: set up .venv if needed, lint, run the whole suite, then the verl integration's tests
# in their own environment (scripts/test_verl.sh; verl pins an older transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench examples
.venv/bin/python -m pytest "$@"
bash scripts/test_verl.sh
