#!/bin/bash
# $1 = tree, $2 = tag
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p /tmp/r7logs && cd $1
for mode in default own_std; do
  extra=""; [ $mode = own_std ] && extra="analysis.components.mode=own_std"
  rm -rf /tmp/review7_run_$2_$mode
  start=$(date +%s)
  PYTHONPATH=$1/src nice -n 5 /work/main/.venv/bin/python -m rlgrad train analysis.every=1 analysis.neurons.actor.nullspace_every=10 actor.ppo_micro_batch_size=128 trainer.total_training_steps=6 trainer.default_local_dir=/tmp/review7_run_$2_$mode $extra > /tmp/r7logs/$2_$mode.log 2>&1
  echo "rc=$? secs=$(( $(date +%s)-start ))" >> /tmp/r7logs/$2_$mode.log
done
