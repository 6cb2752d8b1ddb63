#!/usr/bin/env bash
# The whole verl launch on CPU: `python -m rlgrad.integrations.verl_main` with verl's trainer (Ray local, FSDP2 on
# gloo, a reference model, the hf_cpu rollout backend of rlgrad.integrations.verl_cpu), 2 GRPO steps with rlgrad's
# analysis at step 1, then a resume from verl's global_step_1 that runs step 2 again. Runs in .venv-verl
# (scripts/test_verl.sh makes it); not part of the test suite (about 6 minutes on 2 cores).
#   bash scripts/checks/verl_launch.sh [OUT_DIR] [extra verl overrides...]
# It checks its own outputs (scripts/checks/verl_launch_check.py): metrics.jsonl rows for steps 1 and 2 with verl's
# actor/ keys, analysis/step_1/, the checkpoints, rlgrad's task-gradient norm within 1% of verl's actor/grad_norm at step 1,
# and the resume (verl runs step 2 only; metrics.jsonl keeps step 1's row and recomputes step 2's, once). Exit 0 when
# all hold, 1 with one FAIL line otherwise, the launch's own status when it fails.
# BROKEN_TOKENIZER=1 launches over a tokenizer that does not fit the data: it must stop before Ray, in one line.
# DOCTOR_HALT=1 checks the live doctor instead: a 3-step launch with doctor.halt_on=critical and a thresholds file
# whose KL bound (1e-6) the run passes at step 2 (the KL to the reference is 0 at step 1, ~1e-2 after one update at
# lr 1e-2), trainer.save_freq=10: it must stop after step 2 with exit status 3, kl_blowup in doctor.jsonl and verl's
# checkpoint global_step_2 (saved by the halt); then the same command resumes (verl's resume_mode=auto), runs step 3
# only, does not halt again on the finding already said, and exits 0.
# Every launch is bounded (LAUNCH_TIMEOUT seconds, default 600) and the Ray cluster it started is stopped afterwards.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv-verl/bin/python}
OUT=$(realpath -m "${1:-/tmp/rlgrad_verl_launch}"); shift || true
KIND=${BROKEN_TOKENIZER:+broken}; DATA="$OUT/fixture_${KIND:-good}"
LIMIT=${LAUNCH_TIMEOUT:-600}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" VERL_USE_EXTERNAL_MODULES=rlgrad.integrations.verl_cpu
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
# Memory (the machine is shared): one TransferQueue storage unit (verl's default 8 are 8 Ray actor processes) and
# no Ray dashboard (5 processes). verl's file logger and Hydra write into OUT_DIR, not into the working directory.
[ -d "$DATA/model" ] || $PY scripts/checks/verl_launch_fixture.py "$DATA" ${BROKEN_TOKENIZER:+--broken-tokenizer} >/dev/null 2>&1 \
  || { echo "[verl_launch] FAIL: the fixture in $DATA"; exit 2; }
rm -rf "$OUT/ckpt"  # this script's own run: a fresh one each time (rlgrad refuses another run's metrics.jsonl)
A=actor_rollout_ref
launch() {  # $1: total steps; $2: a name for its Hydra directory (OUT_DIR/hydra_NAME); then extra overrides
  local steps=$1 name=$2; shift 2
  timeout -k 10 "$LIMIT" $PY -m rlgrad.integrations.verl_main hydra.run.dir="$OUT/hydra_$name" \
    algorithm.adv_estimator=grpo data.train_files="$DATA/train.parquet" data.val_files="$DATA/val.parquet" \
    data.train_batch_size=4 data.max_prompt_length=16 data.max_response_length=8 data.dataloader_num_workers=0 \
    reward.custom_reward_function.path="$DATA/reward.py" \
    $A.model.path="$DATA/model" $A.model.use_remove_padding=false +$A.model.override_config.attn_implementation=eager \
    $A.actor.strategy=fsdp2 $A.ref.strategy=fsdp2 $A.actor.ppo_mini_batch_size=4 $A.actor.ppo_micro_batch_size_per_gpu=8 \
    $A.actor.use_kl_loss=true $A.actor.kl_loss_coef=0.05 $A.actor.optim.lr=1e-2 \
    $A.rollout.name=hf_cpu $A.rollout.tensor_model_parallel_size=1 $A.rollout.n=4 $A.rollout.log_prob_micro_batch_size_per_gpu=8 \
    $A.ref.log_prob_micro_batch_size_per_gpu=8 $A.rollout.agent.num_workers=1 \
    trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.device=cpu trainer.total_training_steps="$steps" \
    trainer.save_freq="$SAVE_FREQ" trainer.test_freq=-1 trainer.val_before_train=false trainer.logger='[console,file]' \
    trainer.project_name=rlgrad trainer.experiment_name=cpu_launch trainer.default_local_dir="$OUT/ckpt" \
    transfer_queue.backend.SimpleStorage.num_data_storage_units=1 +ray_kwargs.ray_init.include_dashboard=false \
    +ray_kwargs.ray_init.num_gpus=1 +ray_kwargs.ray_init.num_cpus=64 \
    +$A.rlgrad.analysis.every=2 +$A.rlgrad.analysis.buckets.num_buckets=2 "$@"
}
stop_ray() {  # the cluster launch() started; not while another launch runs (ray stop ends every cluster here)
  pgrep -f "rlgrad.integrations.verl_main" >/dev/null && return 0
  $PY -m ray.scripts.scripts stop --force >/dev/null 2>&1 || true
}
SAVE_FREQ=1
t0=$(date +%s)
if [ -n "${DOCTOR_HALT:-}" ]; then
  SAVE_FREQ=10
  printf 'kl_high: 1.0e-6\nkl_floor: 0\n' >"$OUT/thresholds.yaml"
  H=(+$A.rlgrad.doctor.halt_on=critical +$A.rlgrad.doctor.thresholds="$OUT/thresholds.yaml")
  VERL_FILE_LOGGER_PATH="$OUT/launch.jsonl" launch 3 launch "${H[@]}" "$@" >"$OUT/launch.log" 2>&1; rc=$?
  stop_ray
  t1=$(date +%s)
  echo "[verl_launch] doctor launch: exit $rc after $((t1 - t0)) s (log: $OUT/launch.log)"
  grep -E '^\S*\[doctor\]|\[doctor\] step|stopped by the doctor' "$OUT/launch.log" | sed 's/^/    /' | head -8
  [ $rc -eq 3 ] || { echo "[verl_launch] FAIL: exit $rc, expected 3 (stopped by the doctor)"; exit 1; }
  $PY scripts/checks/verl_launch_check.py halted "$OUT" || exit 1
  VERL_FILE_LOGGER_PATH="$OUT/resume.jsonl" launch 3 resume "${H[@]}" "$@" >"$OUT/resume.log" 2>&1; rc=$?
  stop_ray
  t2=$(date +%s)
  echo "[verl_launch] the same command again (resumes): exit $rc after $((t2 - t1)) s (log: $OUT/resume.log)"
  [ $rc -eq 0 ] || { echo "[verl_launch] FAIL: the resume exited $rc: $(grep -E 'Error|stopped by' "$OUT/resume.log" | tail -1)"; exit 1; }
  $PY scripts/checks/verl_launch_check.py halt_resumed "$OUT" || exit 1
  echo "[verl_launch] all doctor checks passed in $((t2 - t0)) s"
  exit 0
fi
VERL_FILE_LOGGER_PATH="$OUT/launch.jsonl" launch 2 launch "$@" >"$OUT/launch.log" 2>&1; rc=$?
stop_ray
t1=$(date +%s)
echo "[verl_launch] launch: exit $rc after $((t1 - t0)) s (log: $OUT/launch.log)"
if [ $rc -ne 0 ]; then
  echo "[verl_launch] $(grep -E '^rlgrad: error:|Error' "$OUT/launch.log" | tail -1)"
  exit $rc
fi
$PY scripts/checks/verl_launch_check.py first "$OUT" || exit 1
VERL_FILE_LOGGER_PATH="$OUT/resume.jsonl" launch 2 resume trainer.resume_mode=resume_path trainer.resume_from_path="$OUT/ckpt/global_step_1" "$@" \
  >"$OUT/resume.log" 2>&1; rc=$?
stop_ray
t2=$(date +%s)
echo "[verl_launch] resume from global_step_1: exit $rc after $((t2 - t1)) s (log: $OUT/resume.log)"
[ $rc -eq 0 ] || { echo "[verl_launch] FAIL: the resume exited $rc: $(grep -E 'Error' "$OUT/resume.log" | tail -1)"; exit $rc; }
$PY scripts/checks/verl_launch_check.py resume "$OUT" || exit 1
echo "[verl_launch] all checks passed in $((t2 - t0)) s"
