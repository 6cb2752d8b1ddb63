#!/usr/bin/env bash
# Create .venv on first use and install rlgrad into it (idempotent; re-installs when pyproject.toml changes).
# On a machine without torch, the pinned CPU build is installed first: a bare `torch` requirement
# resolved alone would pull a multi-GB CUDA build. Override with RLGRAD_TORCH_SPEC.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${RLGRAD_EXTRAS:-dev}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing ${RLGRAD_TORCH_SPEC:-torch==2.13.0} (CPU build)"
  .venv/bin/pip install -q "${RLGRAD_TORCH_SPEC:-torch==2.13.0}"
fi
stamp=".venv/.rlgrad-install-$(cat pyproject.toml | sha256sum | cut -c1-16)-$EXTRAS"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing rlgrad[$EXTRAS]"
  .venv/bin/pip install -q -e ".[$EXTRAS]" 2>&1 | grep -v -E "^WARNING: Location|^\s*$" || true
  .venv/bin/python -c "import rlgrad, torch, transformers" # fail loudly if the install did not work
  rm -f .venv/.rlgrad-install-*
  touch "$stamp"
fi
