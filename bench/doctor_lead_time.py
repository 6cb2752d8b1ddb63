"""The doctor's lead time: how many steps before a fault shows in validation or reward each signature names it,
against rldoctor 0.2.0 on the same runs (issue 33, item 8; the table in docs/doctor.md, "Lead time").

    .venv/bin/python bench/doctor_lead_time.py --rldoctor /path/to/rldoctor-venv/bin/rldoctor [--jobs 2]

Trains the suite below on the embedded default (``rlgrad train --config-name demo``, ``--steps`` steps, validation
every 2 steps and before training, every instrument every 2 steps: ``analysis.every=2``), each run ``nice``d on one
thread, skipping runs already finished under ``--out`` (a ``done`` file), so an interrupted suite resumes. Then, per
run:

- rlgrad: ``diagnose`` at every prefix of the run (steps 0..s for each s, what the live doctor does after each step,
  ``rlgrad.doctor.live``, here without its 1% cost budget, so no step is skipped), no re-training. The first step
  each finding shows as warn or critical. A signature is *gradient-level* when it reads rlgrad's instruments
  (buckets, components, layers, neurons, per-sample analysis: its ``reads`` column in docs/doctor.md), *scalar*
  when it reads only the logs and the config.
- rldoctor: its CLI (``rldoctor diagnose FILE.jsonl -f json``) on every prefix of the same run, fed the run's own
  ``metrics.jsonl`` rows (verl's file-logger layout ``{"step", "data"}``, which its JSONL reader documents) after a
  leading ``{"config": ...}`` line holding the run's config.yaml (its documented convention). The first step any
  detector says WARNING or CRITICAL.
- The ground truth (``truth``): the first step at which validation shows the fault, the earliest of
  (a) validation: ``val/accuracy``'s gain over its value before training falls below the *smallest* gain of the
  healthy seeds at the same step (a fault is judged against the 3 seeds, a healthy seed against the other two) by
  more than ``margin``, at two validations in a row (the first of them); ``margin`` is twice the standard deviation
  of a difference of two accuracies over ``data.val_size`` prompts, 2·sqrt(2·0.25/n) (0.125 at the demo's 128: two
  validations of the same policy on different prompts differ by that much by chance 5% of the time), so the rule
  is outside both the seeds' spread and the validation set's own noise;
  (b) no signal: the first step whose training reward is the same for every sample (``critic/score/max`` =
  ``critic/score/min``: every group has zero variance).
  The sampled answers' accuracy (``rollout/accuracy``) is not a clause: it is a 128-sample mean whose step-to-step
  noise (±0.15 on the healthy seeds) flagged healthy seed 1 at step 4 under a 0.10 margin.
  The lead of a detection is the ground truth's step minus the detection's: positive means before the fault shows.

Writes ``OUT/lead_time.json`` (everything) and ``OUT/lead_time.md`` (the table docs/doctor.md shows); the stored
copy is ``bench/results/doctor_lead_time.json``, and ``--table bench/results/doctor_lead_time.json`` prints
docs/doctor.md's tables from it alone (tests/doctor/test_heldout.py checks the page holds them).
``--excerpt`` then writes the first ``EXCERPT_STEPS`` steps of ``noisy_reward`` and ``healthy_seed1`` (their
scalar logs and rollout files, trimmed to what ``noisy_verifier`` reads) to ``tests/data/lead_time/``, which
tests/doctor/test_verifier.py reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rlgrad import rundata as D  # noqa: E402
from rlgrad.doctor import diagnose  # noqa: E402
from rlgrad.doctor.findings import ROWS  # noqa: E402
from rlgrad.metrics import RLDOCTOR_NAMES  # noqa: E402

REWARDS = ROOT / "bench" / "lead_time_rewards.py"
BASE = ["--config-name", "demo", "trainer.test_freq=2", "trainer.val_before_train=true", "analysis.every=2",
        "trainer.save_freq=-1", "trainer.logger=[jsonl]", "trainer.num_threads=1"]
GRADIENT_READS = ("buckets", "components", "layers", "neurons", "per-sample")
DETECTS = ("warn", "critical")
RLDOCTOR_DETECTS = ("WARNING", "CRITICAL")
RLDOCTOR_BY_KEY = {ours: theirs for theirs, ours in RLDOCTOR_NAMES.items()}


def reward_fn(name: str, weights: str) -> list[str]:
    """Overrides that score the run with ``bench/lead_time_rewards.py``'s ``name``, its fields weighted so that
    they rebuild the score (rlgrad's component ``rest`` is then 0)."""
    return [f"reward.custom_reward_function.path={REWARDS}", f"reward.custom_reward_function.name={name}",
            f"reward.weights={weights}"]


@dataclass(frozen=True)
class Case:
    overrides: list[str]
    what: str
    healthy: bool = False


SUITE = {
    "lr_too_high": Case(["actor.optim.lr=3e-3", "actor.optim.lr_warmup_steps=0"],
                        "learning rate far too high (3e-3, 30x the preset's, no warm-up)"),
    "kl_huge": Case(["actor.use_kl_loss=true", "actor.kl_loss_coef=50"], "KL coefficient huge (kl_loss_coef 50)"),
    "format_only": Case(["reward.weights={correctness: 0.0, format: 1.0}"],
                        "format-only reward weighting (correctness 0, format 1)"),
    "entropy_collapse": Case(["actor.entropy_coeff=-1.0", "actor.optim.lr=5e-4"],
                             "entropy collapse (entropy_coeff -1, lr 5e-4)"),
    "too_easy": Case(reward_fn("always_right", "{}"), "zero-variance groups, too easy (every answer paid 1)"),
    "too_hard": Case(["model.warmstart_steps=0"], "zero-variance groups, too hard (no warm start: never right)"),
    "length_runaway": Case(reward_fn("longer", "{correctness: 0.9, format: 0.1, length: 1.0}"),
                           "length runaway (0.5 reward per character: a cut response outpays a right one)"),
    "noisy_reward": Case(reward_fn("noisy", "{correctness: 0.9, format: 0.1}"),
                         "noisy reward (correctness flipped on 40% of samples)"),
    "std_norm_binary": Case(["algorithm.norm_adv_by_std_in_grpo=true",
                             "reward.weights={correctness: 1.0, format: 0.0}"],
                            "hidden: std-normalised advantages on a binary reward"),
    "brevity_takeover": Case(reward_fn("brevity", "{correctness: 1.0, brevity: 1.0}"),
                             "hidden: a shortness reward that outpays correctness"),
    **{f"healthy_seed{k}": Case([f"trainer.seed={k}"], f"healthy (the demo, seed {k})", healthy=True)
       for k in (1, 2, 3)},
}


def train(name: str, out: Path, steps: int) -> str:
    """Train one run of the suite unless ``out/name`` holds a finished one; returns what happened."""
    return train_run(out / name, [*BASE, f"trainer.total_training_steps={steps}", *SUITE[name].overrides])


def train_run(run: Path, overrides: list[str]) -> str:
    """``rlgrad train`` with ``overrides`` into ``run`` (its log beside it), ``nice``d on one thread, unless ``run``
    holds a finished one (a ``done`` file); its checkpoints deleted afterwards. Returns what happened."""
    name = run.name
    if (run / "done").is_file():
        return f"{name}: kept ({(run / 'done').read_text().strip()} s when trained)"
    shutil.rmtree(run, ignore_errors=True)
    cmd = ["nice", "-n", "10", sys.executable, "-m", "rlgrad", "train", *overrides,
           f"trainer.default_local_dir={run}", f"trainer.experiment_name={name}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    (run.parent / f"{name}.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        return f"{name}: FAILED (exit {res.returncode}; {run.parent / name}.log)"
    took = time.perf_counter() - t0
    for ckpt in run.glob("global_step_*"):  # the studies read the logs and analysis files, not the weights
        shutil.rmtree(ckpt)
    (run / "done").write_text(f"{took:.1f}\n")
    return f"{name}: trained in {took:.0f} s"


# ---------------------------------------------------------------- first detections


def is_gradient_level(sid: str) -> bool:
    return any(word in ROWS[sid][0] for word in GRADIENT_READS)


def rlgrad_firsts(run: D.RunData) -> dict[str, dict]:
    """finding -> {step, severity} of its first appearance as warn or critical, diagnosing every prefix."""
    first: dict[str, dict] = {}
    for s in sorted(run.rows):
        part = dataclasses.replace(run, rows={k: m for k, m in run.rows.items() if k <= s},
                                   nonfinite={k: b for k, b in run.nonfinite.items() if k <= s})
        for f in diagnose(part).findings:
            if f.severity in DETECTS and f.id not in first:
                first[f.id] = {"step": s, "severity": f.severity, "gradient": is_gradient_level(f.id),
                               "title": f.title}
    return first


# rldoctor's CLI (``rl_doctor.cli.main``, what its ``rldoctor`` script runs) on each prefix file, in one process of
# its own interpreter: the same parsing, reading, detectors and JSON report as a shell call, without ~1 s of start-up
# per prefix on a loaded machine
RLDOCTOR_DRIVER = """
import sys
from rl_doctor.cli import main
for path in sys.argv[1:]:
    try:
        main(["diagnose", path, "-f", "json", "--no-color", "-o", path + ".json"])
    except Exception as e:  # a prefix too short for it to read: no report
        print(path, type(e).__name__, e, file=sys.stderr)
"""


def in_rldoctors_names(row: dict) -> dict:
    """A metrics.jsonl row with rlgrad's keys in rldoctor's canonical names (``rlgrad.metrics.foreign``), the keys
    it has no name for dropped (its suffix matching would misread some: rollout/accuracy as a held-out score)."""
    data = {RLDOCTOR_BY_KEY[k]: v for k, v in row["data"].items() if k in RLDOCTOR_BY_KEY}
    return {"step": row["step"], "data": data}


def rldoctor_firsts(run_dir: Path, exe: str, spelled: bool = False) -> dict[str, dict]:
    """detector -> {step, severity} of its first WARNING or CRITICAL, rldoctor's CLI on every prefix of the run:
    its metrics.jsonl rows as written, or (``spelled``) under rldoctor's own names."""
    config = D.load_run(run_dir).config or {}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [in_rldoctors_names(r) if spelled else r for r in rows]
    steps = sorted({r["step"] for r in rows})
    first: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="lead-rldoctor-") as tmp:
        files = []
        for s in steps:
            files.append(Path(tmp) / f"upto_{s}.jsonl")
            lines = [{"config": config}, *[r for r in rows if r["step"] <= s]]
            files[-1].write_text("".join(json.dumps(x) + "\n" for x in lines))
        python = Path(exe).parent / "python"
        subprocess.run(["nice", "-n", "10", str(python), "-c", RLDOCTOR_DRIVER, *map(str, files)],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for s, f in zip(steps, files):
            report = Path(f"{f}.json")
            found = json.loads(report.read_text())["findings"] if report.is_file() else []
            for x in found:
                if x["severity"] in RLDOCTOR_DETECTS and x["detector"] not in first:
                    first[x["detector"]] = {"step": s, "severity": x["severity"], "summary": x["summary"]}
    return first


# ---------------------------------------------------------------- ground truth


def gains(run: D.RunData, key: str) -> dict[int, float]:
    """step -> ``key``'s rise over its first logged value."""
    steps, vals = D.series(run, key)
    return {s: x - vals[0] for s, x in zip(steps, vals)}


def val_margin(run: D.RunData) -> float:
    """Twice the std of a difference of two accuracies near 0.5 over ``data.val_size`` prompts (module docstring)."""
    n = D.config_get(run, "data.val_size") or 128
    return 2 * math.sqrt(2 * 0.25 / int(n))


def lag_step(gain: dict[int, float], ref: dict[int, float], margin: float) -> int | None:
    """The first step of two in a row (of the steps both have) at which ``gain`` is more than ``margin`` below
    ``ref``."""
    common = sorted(s for s in gain if s in ref and s >= 1)
    behind = [gain[s] < ref[s] - margin for s in common]
    for i, s in enumerate(common):
        if behind[i] and (i + 1 == len(common) or behind[i + 1]):
            return s
    return None


def lowest_of(curves: list[dict[int, float]]) -> dict[int, float]:
    """step -> the smallest of the curves' values, at the steps all of them have."""
    common = set.intersection(*(set(c) for c in curves)) if curves else set()
    return {s: min(c[s] for c in curves) for s in common}


def truth(run: D.RunData, ref_val: dict[int, float]) -> dict:
    """The ground truth's step and the rule that gave it (module docstring), or step None."""
    steps, top = D.series(run, "critic/score/max")
    low = dict(zip(*D.series(run, "critic/score/min")))
    rules = {"validation": lag_step(gains(run, "val/accuracy"), ref_val, val_margin(run)),
             "no signal": next((s for s, x in zip(steps, top) if s >= 1 and x - low.get(s, x - 1) < 1e-9), None)}
    shown = {k: s for k, s in rules.items() if s is not None}
    if not shown:
        return {"step": None, "rule": "not shown", "rules": rules}
    rule = min(shown, key=lambda k: shown[k])
    return {"step": shown[rule], "rule": rule, "rules": rules}


# ---------------------------------------------------------------- the table


def earliest(first: dict[str, dict], keep=lambda sid: True) -> tuple[int, list[str]] | None:
    """(step, the findings that fire first) among ``first``'s findings that ``keep`` keeps."""
    steps = {sid: d["step"] for sid, d in first.items() if keep(sid)}
    if not steps:
        return None
    s = min(steps.values())
    return s, sorted(sid for sid, x in steps.items() if x == s)


def cell(found: tuple[int, list[str]] | None, gt: int | None) -> tuple[str, str]:
    """(the detection as a cell, its lead over the ground truth)."""
    if found is None:
        return "—", "—"
    s, ids = found
    lead = "—" if gt is None else f"{gt - s:+d}"
    return f"{', '.join(f'`{i}`' for i in ids)} @ {s}", lead


def truth_words(t: dict) -> str:
    return "not shown" if t["step"] is None else f"{t['step']} ({t['rule']})"


def table(results: dict) -> str:
    rows = ["| fault | ground truth: step (rule) | first gradient-level signature @ step | first scalar signature "
            "@ step | rldoctor, rlgrad's metrics.jsonl @ step | rldoctor, its own names @ step | lead: gradient / "
            "scalar / rldoctor / rldoctor (own names) |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if SUITE[name].healthy:
            continue
        gt = r["truth"]["step"]
        cells = [cell(earliest(r["rlgrad"], is_gradient_level), gt),
                 cell(earliest(r["rlgrad"], lambda sid: not is_gradient_level(sid)), gt),
                 cell(earliest(r["rldoctor"]), gt), cell(earliest(r["rldoctor_spelled"]), gt)]
        rows.append(f"| {name}: {SUITE[name].what} | {truth_words(r['truth'])} | "
                    + " | ".join(c for c, _ in cells) + " | " + " / ".join(lead for _, lead in cells) + " |")
    rows += ["", "| healthy run | rlgrad: warn / critical findings at any prefix | rldoctor (metrics.jsonl): WARNING / "
                 "CRITICAL at any prefix | rldoctor (own names) | ground-truth rule against the other seeds |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        if SUITE[name].healthy:
            rows.append(f"| {name} | {alarms(r['rlgrad'])} | {alarms(r['rldoctor'])} | "
                        f"{alarms(r['rldoctor_spelled'])} | {truth_words(r['truth'])} |")
    return "\n".join(rows) + "\n"


def alarms(first: dict[str, dict]) -> str:
    return ", ".join(f"`{i}` ({d['severity'].lower()} @ {d['step']})" for i, d in sorted(first.items())) or "none"


def detect(name: str, out: Path, exe: str | None) -> dict:
    """One run's first detections by rlgrad and rldoctor (kept in ``out/name/lead.json``: done once)."""
    cache = out / name / "lead.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    t0 = time.perf_counter()
    ours = rlgrad_firsts(D.load_run(out / name))
    t1 = time.perf_counter()
    theirs = rldoctor_firsts(out / name, exe) if exe else {}
    spelled = rldoctor_firsts(out / name, exe, spelled=True) if exe else {}
    found = {"rlgrad": ours, "rldoctor": theirs, "rldoctor_spelled": spelled,
             "seconds": {"rlgrad": t1 - t0, "rldoctor": (time.perf_counter() - t1) / 2}}
    cache.write_text(json.dumps(found, indent=1) + "\n")
    return found


def run_one(name: str, out: Path, steps: int, exe: str | None) -> str:
    said = train(name, out, steps)
    if (out / name / "done").is_file():
        found = detect(name, out, exe)
        said += (f"; rlgrad {({k: d['step'] for k, d in found['rlgrad'].items()})}; rldoctor "
                 f"{({k: d['step'] for k, d in found['rldoctor'].items()})}")
    return said


def evaluate(out: Path, names: list[str], exe: str | None) -> dict:
    """Every run's detections, its ground truth (against the healthy seeds of ``names``) and what it took."""
    runs = {n: D.load_run(out / n) for n in names}
    healthy = [n for n in names if SUITE[n].healthy]
    results = {}
    for n in names:
        refs = [runs[h] for h in healthy if h != n]  # a healthy seed is judged against the other seeds
        ref_val = lowest_of([gains(h, "val/accuracy") for h in refs])
        results[n] = {"what": SUITE[n].what, "steps": max(runs[n].rows), "truth": truth(runs[n], ref_val),
                      "trained_s": float((out / n / "done").read_text()), **detect(n, out, exe)}
    return results


EXCERPT = ("noisy_reward", "healthy_seed1")
EXCERPT_STEPS = 3
EXCERPT_KEYS = ("critic/score/", "reward/", "rollout/accuracy", "val/accuracy")
EXCERPT_FIELDS = ("step", "index", "group_id", "prompt", "response", "components", "total")


def excerpt(out: Path, dest: Path = ROOT / "tests" / "data" / "lead_time") -> None:
    """The first ``EXCERPT_STEPS`` steps of the ``EXCERPT`` runs, small enough to keep in the repository."""
    for name in EXCERPT:
        src, to = out / name, dest / name
        shutil.rmtree(to, ignore_errors=True)
        (to / "rollouts").mkdir(parents=True)
        shutil.copy(src / "config.yaml", to / "config.yaml")
        rows = [json.loads(line) for line in (src / "metrics.jsonl").read_text().splitlines() if line.strip()]
        keep = [{"step": r["step"], "data": {k: x for k, x in r["data"].items() if k.startswith(EXCERPT_KEYS)}}
                for r in rows if r["step"] <= EXCERPT_STEPS]
        (to / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keep))
        for step in range(1, EXCERPT_STEPS + 1):
            lines = (src / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
            trimmed = [{k: x for k, x in json.loads(line).items() if k in EXCERPT_FIELDS} for line in lines]
            (to / "rollouts" / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trimmed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "lead_time")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=1, help="runs trained at once (each on one thread)")
    ap.add_argument("--rldoctor", default=shutil.which("rldoctor"),
                    help="rldoctor 0.2.0's CLI (in its own venv); none: rlgrad's doctor alone")
    ap.add_argument("--only", nargs="*", default=list(SUITE), choices=list(SUITE), metavar="RUN")
    ap.add_argument("--excerpt", action="store_true", help="then write tests/data/lead_time/ (see above)")
    ap.add_argument("--table", type=Path, metavar="JSON", help="print the tables of a stored lead_time.json "
                    "(bench/results/doctor_lead_time.json: docs/doctor.md's) and stop")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(a.table.read_text())), end="")
        return
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for line in pool.map(lambda n: run_one(n, a.out, a.steps, a.rldoctor), a.only):
            print(line, flush=True)
    print(f"training and detection: {time.perf_counter() - t0:.0f} s wall", flush=True)
    failed = [n for n in a.only if not (a.out / n / "done").is_file()]
    if failed:
        sys.exit(f"not trained: {', '.join(failed)} (see their .log under {a.out})")
    results = evaluate(a.out, a.only, a.rldoctor)
    (a.out / "lead_time.json").write_text(json.dumps(results, indent=1) + "\n")
    md = table(results)
    (a.out / "lead_time.md").write_text(md)
    print(md)
    print(f"total: {time.perf_counter() - t0:.0f} s wall; {a.out / 'lead_time.json'}")
    if a.excerpt:
        excerpt(a.out)


if __name__ == "__main__":
    main()
