"""``rlgrad doctor --selftest``: the doctor on recorded runs with known faults (``tests/data/doctor``, built by
``scripts/generate/doctor_fixtures.py``), each with the finding it must give, and on healthy runs, read at every
prefix as a live doctor reads them, where nothing serious may fire. The test suite checks the same matrix
(tests/doctor/test_selftest.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

from rlgrad import rundata as D
from rlgrad.doctor.diagnose import diagnose
from rlgrad.doctor.findings import Diagnosis, at_or_above
from rlgrad.errors import UserError

# healthy fixture -> the severity no finding may reach at its end; at no prefix of any of them may a finding be
# critical (issue 33: the demo under 3 seeds, a weakly warm-started model, runs with a fault's advice followed).
HEALTHY = {"healthy": "warn", "healthy_issue37": "warn", "healthy_seed2": "warn", "healthy_seed3": "warn",
           "lr_fast_collapse_followed": "warn", "weak_start": "warn", "entropy_penalty_removed": "warn",
           "kl_coef_huge_followed": "warn", "entropy_collapse_followed": "warn", "std_norm_binary_followed": "warn",
           "dormant_followed": "warn", "noisy_verifier_followed": "warn",
           "batch_small_lr_lowered": "warn", "batch_small_lr_lowered_seed2": "warn",
           "brevity_takeover_followed": "warn", "reward_overflow_followed": "warn", "format_heavy_followed": "warn"}
NEVER_LIVE = ("critical",)
# faulty fixture -> (the finding it must give, its least severity): the faults that
# scripts/generate/doctor_fixtures.py induces
FAULTS: dict[str, tuple[str, str]] = {
    "lr_too_low": ("lr_too_small", "warn"), "tiny_grad_clip": ("clip_every_step", "info"),
    "std_norm_binary": ("std_normalisation_amplifies", "info"),  # rlgrad's default, no harm measured: a note
    "format_heavy": ("component_dominates", "warn"),
    "kl_explodes": ("kl_blowup", "warn"), "entropy_collapse": ("entropy_collapse", "warn"),
    "zero_variance": ("zero_variance_groups", "warn"), "trl_lr_too_low": ("lr_too_small", "warn"),
    "lr_too_high": ("reward_collapse", "critical"), "lr_fast_collapse": ("reward_collapse", "critical"),
    "lr_slow": ("lr_too_small", "warn"), "truncated": ("length_truncated", "warn"),
    "entropy_penalty": ("regularizer_dominates", "warn"), "reward_inverted": ("inverted_reward", "critical"),
    "trl_too_easy": ("zero_variance_groups", "critical"), "wandb_kl_explodes.json": ("kl_blowup", "warn"),
    "kl_lr_high": ("kl_blowup", "critical"), "kl_coef_huge": ("regularizer_dominates", "warn"),
    "noisy_verifier": ("noisy_verifier", "warn"), "batch_small_seed2": ("val_falls", "critical"),
    "batch_large": ("batch_above_noise_scale", "info"),
    "brevity_takeover": ("component_takes_over", "warn"), "batch_small": ("batch_below_noise_scale", "info"),
    "length_squeezed": ("length_collapse", "warn"), "reward_overflow": ("nonfinite_steps", "critical"),
    "jackpot_unclipped": ("grad_norm_spike", "warn"),
}
MATRIX = [*HEALTHY, *FAULTS]


def fixtures_dir() -> Path:
    """The recorded runs of the source checkout rlgrad runs from."""
    return Path(__file__).resolve().parents[3] / "tests" / "data" / "doctor"


def prefix(run: D.RunData, n: int) -> D.RunData:
    """The run as it stood after step ``n`` (what a live doctor reads then)."""
    out = copy.copy(run)
    out.rows = {s: m for s, m in run.rows.items() if s <= n}
    out.nonfinite = {s: k for s, k in run.nonfinite.items() if s <= n}
    return out


def prefixes(run: D.RunData) -> Iterator[tuple[int, Diagnosis]]:
    """The diagnosis after each training step."""
    for n in sorted(s for s in run.rows if s >= 1):
        yield n, diagnose(prefix(run, n))


def load(root: Path, name: str) -> D.RunData:
    path = root / name
    if name.endswith(".json"):  # a W&B history (scan_history's rows), recorded
        import json

        return D.RunData(name=name, source=str(path), rows=D.records_from_wandb_rows(json.loads(path.read_text())),
                         kind="wandb")
    return D.load_any(path)


def check(root: Path, name: str) -> tuple[bool, str]:
    """(passed, a line saying what the doctor found) for one fixture of the matrix."""
    run = load(root, name)
    if name in HEALTHY:
        loud = [f"{f.id} ({f.severity})" for f in diagnose(run).findings
                if at_or_above(f.severity, HEALTHY[name])]
        live = [(n, f.id) for n, d in prefixes(run) for f in d.findings if f.severity in NEVER_LIVE]
        if loud or live:
            what = ", ".join(loud + [f"{fid} at step {n}" for n, fid in live[:3]])
            return False, f"FALSE ALARM {name}: healthy, but {what}"
        return True, (f"quiet     {name}: healthy, nothing at {HEALTHY[name]} or above at its end, nothing "
                      f"critical at any of its {len(run.rows)} steps")
    fid, least = FAULTS[name]
    hit = next((f for f in diagnose(run).findings if f.id == fid), None)
    if hit is not None and at_or_above(hit.severity, least):
        return True, f"detected  {name}: {fid} ({hit.severity}) from step {hit.step}"
    got = f"{fid} only as {hit.severity}" if hit else f"no {fid}"
    return False, f"MISSED    {name}: expected {fid} (at least {least}), got {got}"


def selftest(root: str | Path | None = None) -> int:
    """Print detected / missed / quiet / false alarm for each fixture of the matrix; 0 when all pass, else 1."""
    base = Path(root) if root else fixtures_dir()
    absent = [n for n in MATRIX if not (base / n).exists()]
    if len(absent) == len(MATRIX):
        raise UserError(f"--selftest: no recorded runs in '{base}' (they ship with rlgrad's source checkout, "
                        "tests/data/doctor; build them with scripts/generate/doctor_fixtures.py, or name their folder)")
    results = [check(base, n) for n in MATRIX if n not in absent]
    for _, line in results:
        print(line)
    passed = sum(ok for ok, _ in results)
    print(f"{passed} of {len(results)} fixtures as expected" + (f" ({len(absent)} absent: {', '.join(absent)})"
                                                                 if absent else ""))
    return 0 if passed == len(results) else 1
