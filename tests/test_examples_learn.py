"""The shipped examples still learn (e2e, scripts/test_e2e.sh): the demo and the custom-reward preset, each run as a
user runs it but for 30 of its steps, must raise greedy validation accuracy by at least 15 points and end at 70% or
more. A loose guard (the sign and a floor), not the figure: docs/benchmarks.md#what-the-examples-show has the
measured ones (+35 to +44 points in the full presets, 3 seeds each; by step 20 every stored seed of both was +34
or more, bench/results/examples/). About 30 s each on one core, a minute under load."""

import json
import statistics

import pytest

from tests.conftest import run_cli

STEPS = 30
GAIN, FLOOR = 0.15, 0.70


def val_curve(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["data"]["val/accuracy"] for r in rows if "val/accuracy" in r["data"]}


def train_preset(preset: str, tmp_path, model_cache):
    run_dir = tmp_path / preset
    done = run_cli(["train", "--config-name", preset, f"trainer.total_training_steps={STEPS}",
                    f"trainer.test_freq={STEPS}", "trainer.seed=1", "trainer.save_freq=-1", "trainer.logger=[jsonl]",
                    "trainer.num_threads=1", f"model.cache_dir={model_cache}", f"trainer.default_local_dir={run_dir}"],
                   env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir


@pytest.mark.e2e
@pytest.mark.parametrize("preset", ["demo", "custom_reward_demo"])
def test_the_example_still_learns(preset, tmp_path, model_cache):
    run_dir = train_preset(preset, tmp_path, model_cache)
    curve = val_curve(run_dir)
    start, end = curve[0], curve[STEPS]
    assert end - start >= GAIN and end >= FLOOR, (preset, curve)
    if preset == "custom_reward_demo":  # and it still shows the geometry: rest 0, acc carrying the update
        rows = [json.loads(line)["data"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        rest = [r["grad_comp/rest/share"] for r in rows if "grad_comp/rest/share" in r]
        acc = [r["grad_comp/acc/share"] for r in rows if "grad_comp/acc/share" in r]
        assert len(rest) == STEPS and max(abs(v) for v in rest) < 1e-6
        assert statistics.median(acc) > 0.5
