#!/usr/bin/env bash
# The end-to-end checks, kept out of the test suite's 10 minutes: the tests marked `e2e` (whole CLI runs of
# presets and the README, torchrun with several processes, SmolLM2-135M from its GGUF), then the verl
# integration's tests in their own environment .venv-verl (scripts/test_verl.sh; verl pins an older transformers).
# About 8 minutes on 2 cores once both environments exist (7.5 of them the e2e tests, the Sokoban demo's guard the
# longest). CI (.ci/run) runs it after scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -m e2e "$@"
bash scripts/test_verl.sh
