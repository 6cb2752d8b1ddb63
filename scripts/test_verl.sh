#!/usr/bin/env bash
# The verl integration's tests, in their own environment .venv-verl: verl pins transformers below the
# version of rlgrad's main environment. Creates it on first use (idempotent, re-installs when pyproject.toml
# changes), then runs tests/integrations/test_verl.py there. RLGRAD_SKIP_VERL=1 skips this step. The whole launch on CPU (Ray,
# 2 GRPO steps and a resume, about 4-6 minutes) is a separate check that asserts its own outputs:
#   PYTHON=.venv-verl/bin/python bash scripts/checks/verl_launch.sh /tmp/vl
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${RLGRAD_SKIP_VERL:-}" ] && { echo "[verl] skipped (RLGRAD_SKIP_VERL)"; exit 0; }
PYTHON=${PYTHON:-python3}
VENV=.venv-verl
if [ ! -x $VENV/bin/python ]; then
  echo "[verl] creating $VENV"
  "$PYTHON" -m venv $VENV
fi
if ! $VENV/bin/python -c "import torch" >/dev/null 2>&1; then
  $VENV/bin/pip install -q "${RLGRAD_TORCH_SPEC:-torch==2.13.0}" 2>&1 | grep -v -E "^WARNING: Location|^\s*$" || true
fi
stamp="$VENV/.rlgrad-install-$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[verl] installing rlgrad[verl] and what verl's trainer imports on a CPU machine"
  # verl's V1 trainer imports TransferQueue, its rollout router cachetools/msgspec/pyzmq, its servers
  # uvicorn/fastapi (verl[verl-core] has them, with GPU-only packages this machine cannot install).
  $VENV/bin/pip install -q -e ".[verl]" pytest "TransferQueue>=0.1.10" cachetools msgspec pyzmq uvicorn fastapi \
    2>&1 | grep -v -E "^WARNING: Location|^\s*$" || true
  $VENV/bin/python -c "import rlgrad, verl, transfer_queue" # fail loudly if the install did not work
  rm -f $VENV/.rlgrad-install-*
  touch "$stamp"
fi
$VENV/bin/python -m pytest -p no:cacheprovider tests/integrations/test_verl.py "$@"
