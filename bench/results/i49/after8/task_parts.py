"""Wall time per step of the task-term instruments' parts outside the update's backward (issue 49, branch after8;
bench/results/i49/hooks7/instrument_parts.py with the ``task`` instruments and their parts).

The bench's task-term setting (bench/always_on_cost.py ``--instruments task actor.ppo_micro_batch_size=128``, one
thread), every step instrumented; each function named below is
wrapped in a timer (by its name in the module that calls it), and each hook phase of ``HookRunner`` too, whose
label a part's time carries. Printed: the median and mean ms per step over ``--steps`` steps after 2 warm-up
steps. Run it on two trees (``PYTHONPATH=<tree>/src``) back to back to compare them; a name a tree lacks is left out.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=src python bench/results/i49/after8/task_parts.py --steps 30
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "hooks7"))
from instrument_parts import measure  # noqa: E402  (hooks7's timers, this file's parts and setting)

# bench/always_on_cost.py's INSTRUMENTS["task"] (copied: this file runs on trees whose bench/ may differ)
TASK = ["analysis.buckets.every=1", "analysis.components.every=1", "analysis.per_sample.every=1",
        "analysis.per_sample.terms=[task]", "actor.entropy_coeff=0", "actor.use_kl_loss=false"]

PARTS = [
    "per_sample.PerSampleHook.measure", "per_sample.analyse_per_sample", "per_sample.proxy_correlation",
    "per_sample.null_permutations", "per_sample.global_buckets", "per_sample.group_noise", "per_sample.sample_rows",
    "per_sample.layer_summary", "per_sample.fast_unsupported", "buckets.GradientAnalysisHook.measure",
    "buckets.analyse_buckets", "buckets.global_buckets", "buckets.fast_unsupported", "buckets._loss_values",
    "buckets._from_groups", "components.ComponentGeometryHook.measure", "components.analyse_components",
    "components.component_advantages", "components._component_grams", "components._with_zero_slices",
    "components.fast_unsupported", "components.split_advantages", "instrument.fast_unsupported",
    "instrument.InstrumentHook.write", "instrument.atomic_write_text",
    "instrument.atomic_write_json", "groups.rides_on_update", "groups.group_pass",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    measure(PARTS, TASK, ap.parse_args().steps)


if __name__ == "__main__":
    main()
