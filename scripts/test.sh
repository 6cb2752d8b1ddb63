#!/usr/bin/env bash
# The test command: set up .venv if needed, lint, run the test suite (under 4 CPU-minutes, 5 minutes on 2 shared cores:
# README; one environment). The end-to-end checks (whole CLI runs, several processes, the real model, verl in its own
# environment) are scripts/test_e2e.sh; CI (.ci/run) runs both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench examples scripts
.venv/bin/python -m pytest "$@"
