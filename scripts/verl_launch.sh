#!/usr/bin/env bash
# The whole verl launch on CPU: `python -m rlgrad.integrations.verl_main` with verl's trainer (Ray local, FSDP2 on
# gloo, a reference model, the hf_cpu rollout backend of rlgrad.integrations.verl_cpu), 2 GRPO steps with rlgrad's
# analysis at step 1, then a resume from verl's global_step_1. Runs in .venv-verl (scripts/test_verl.sh makes it).
#   bash scripts/verl_launch.sh [OUT_DIR] [extra verl overrides...]
# Every launch is bounded (LAUNCH_TIMEOUT seconds, default 600) and Ray is stopped afterwards.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv-verl/bin/python}
OUT=$(realpath -m "${1:-/tmp/rlgrad_verl_launch}"); shift || true
LIMIT=${LAUNCH_TIMEOUT:-600}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" VERL_USE_EXTERNAL_MODULES=rlgrad.integrations.verl_cpu
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
[ -d "$OUT/model" ] || $PY scripts/verl_launch_fixture.py "$OUT" ${BROKEN_TOKENIZER:+--broken-tokenizer} || exit 2
A=actor_rollout_ref
launch() {  # $1: total steps; then extra overrides
  local steps=$1; shift
  timeout -k 10 "$LIMIT" $PY -m rlgrad.integrations.verl_main \
    algorithm.adv_estimator=grpo data.train_files="$OUT/train.parquet" data.val_files="$OUT/val.parquet" \
    data.train_batch_size=4 data.max_prompt_length=16 data.max_response_length=8 data.dataloader_num_workers=0 \
    reward.custom_reward_function.path="$OUT/reward.py" \
    $A.model.path="$OUT/model" $A.model.use_remove_padding=false +$A.model.override_config.attn_implementation=eager \
    $A.actor.strategy=fsdp2 $A.ref.strategy=fsdp2 $A.actor.ppo_mini_batch_size=4 $A.actor.ppo_micro_batch_size_per_gpu=8 \
    $A.actor.use_kl_loss=true $A.actor.kl_loss_coef=0.05 $A.actor.optim.lr=1e-2 \
    $A.rollout.name=hf_cpu $A.rollout.tensor_model_parallel_size=1 $A.rollout.n=4 $A.rollout.log_prob_micro_batch_size_per_gpu=8 \
    $A.ref.log_prob_micro_batch_size_per_gpu=8 $A.rollout.agent.num_workers=1 \
    trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.device=cpu trainer.total_training_steps="$steps" \
    trainer.save_freq=1 trainer.test_freq=-1 trainer.val_before_train=false trainer.logger='[console,file]' \
    trainer.project_name=rlgrad trainer.experiment_name=cpu_launch trainer.default_local_dir="$OUT/ckpt" \
    +ray_kwargs.ray_init.num_gpus=1 +ray_kwargs.ray_init.num_cpus=64 \
    +$A.rlgrad.analysis.every=2 +$A.rlgrad.analysis.buckets.num_buckets=2 "$@"
}
t0=$(date +%s)
launch 2 "$@"; rc=$?
echo "[verl_launch] exit $rc after $(( $(date +%s) - t0 )) s"
$PY -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
exit $rc
