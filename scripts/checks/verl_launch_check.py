"""What ``scripts/checks/verl_launch.sh`` asserts about its own outputs, after the launch and after the resume.

    python scripts/checks/verl_launch_check.py first OUT_DIR         # after the 2-step launch
    python scripts/checks/verl_launch_check.py resume OUT_DIR        # after the resume from verl's global_step_1
    python scripts/checks/verl_launch_check.py halted OUT_DIR        # DOCTOR_HALT=1: the launch the doctor stopped
    python scripts/checks/verl_launch_check.py halt_resumed OUT_DIR  # DOCTOR_HALT=1: after the same command again

Prints one line per check passed; the first that fails prints ``[verl_launch] FAIL: <what>`` and exits 1.
"""

import json
import re
import sys
from pathlib import Path

AGREEMENT = 0.01  # rlgrad's fp32 task-gradient norm vs verl's bf16-mixed-precision actor/grad_norm, step 1


def fail(msg: str) -> None:
    print(f"[verl_launch] FAIL: {msg}")
    sys.exit(1)


def rows(path: Path) -> list[dict]:
    if not path.is_file():
        fail(f"no {path}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def verl_steps(log: Path) -> list[int]:
    """The steps verl's console logger printed (``step:N - key:value ...``) in a launch's log."""
    return [int(m) for m in re.findall(r"\bstep:(\d+) - ", log.read_text(errors="replace"))]


def checkpoints(ckpt: Path) -> None:
    """verl's checkpoints of the 2-step launch: each step's actor weights, and step 2 recorded as the latest."""
    for s in (1, 2):
        if not (ckpt / f"global_step_{s}" / "actor" / "model_world_size_1_rank_0.pt").is_file():
            fail(f"verl's checkpoint {ckpt / f'global_step_{s}'} has no actor weights")
    if (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() != "2":
        fail("latest_checkpointed_iteration.txt is not 2")


def grad_norms(step_1: dict) -> tuple[float, float, float]:
    """rlgrad's task-gradient norm and verl's actor/grad_norm at step 1, and how far apart they are (relative)."""
    ours, theirs = step_1.get("grad_norm/all/task"), step_1.get("actor/grad_norm")
    if ours is None or theirs is None:
        fail("grad_norm/all/task or actor/grad_norm missing at step 1")
    if not theirs > 0:
        fail(f"verl's actor/grad_norm is {theirs} at step 1: no gradient to compare")
    rel = abs(ours - theirs) / theirs
    if rel > AGREEMENT:
        fail(f"step 1: rlgrad's grad_norm/all/task {ours:.6g} vs verl's actor/grad_norm {theirs:.6g}, "
             f"{100 * rel:.2f}% apart (> {100 * AGREEMENT:g}%)")
    return ours, theirs, rel


def first(out: Path) -> None:
    run, ckpt = out / "ckpt" / "rlgrad", out / "ckpt"
    got = rows(run / "metrics.jsonl")
    steps = [r["step"] for r in got]
    if steps != [1, 2]:
        fail(f"metrics.jsonl steps {steps}, expected [1, 2]")
    by = {r["step"]: r["data"] for r in got}
    missing = [k for k in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/lr") if k not in by[2]]
    if missing:
        fail(f"verl's actor metrics {missing} missing from metrics.jsonl at step 2")
    files = sorted(p.name for p in (run / "analysis" / "step_1").glob("*"))
    if not files:
        fail(f"no files in {run / 'analysis' / 'step_1'}")
    checkpoints(ckpt)
    if verl_steps(out / "launch.log") != [1, 2]:
        fail(f"verl printed steps {verl_steps(out / 'launch.log')}, expected [1, 2]")
    ours, theirs, rel = grad_norms(by[1])
    (out / "first_metrics.jsonl").write_text((run / "metrics.jsonl").read_text())
    print(f"[verl_launch] ok: steps 1-2 in metrics.jsonl with verl's actor/ keys; analysis/step_1: {', '.join(files)}; "
          f"checkpoints global_step_1..2")
    print(f"[verl_launch] ok: step 1 grad norm: rlgrad {ours:.6g}, verl {theirs:.6g} ({100 * rel:.3f}% apart)")


def resume(out: Path) -> None:
    run = out / "ckpt" / "rlgrad"
    before = {r["step"]: r for r in rows(out / "first_metrics.jsonl")}
    got = rows(run / "metrics.jsonl")
    steps = [r["step"] for r in got]
    if steps != [1, 2]:
        fail(f"after the resume metrics.jsonl has steps {steps}, expected [1, 2] (no duplicate, none lost)")
    if got[0] != before[1]:
        fail("the resume rewrote step 1's row of metrics.jsonl")
    printed = verl_steps(out / "resume.log")
    if printed != [2]:
        fail(f"the resumed launch printed steps {printed}, expected [2] (continuing after global_step_1)")
    log = (out / "resume.log").read_text(errors="replace")
    if "global_step_1" not in log:
        fail("the resumed launch's log does not name global_step_1")
    a, b = before[2]["data"].get("actor/grad_norm"), got[1]["data"].get("actor/grad_norm")
    print(f"[verl_launch] ok: resumed from global_step_1, verl ran step 2 only; metrics.jsonl steps [1, 2], step 1's "
          f"row kept, step 2's recomputed (actor/grad_norm {b:.6g}; first launch {a:.6g}, rollouts are resampled)")


def said(run: Path) -> list[tuple[int, str, str]]:
    """doctor.jsonl's findings: (step, finding, severity)."""
    return [(r["step"], r["finding"], r["severity"]) for r in rows(run / "doctor.jsonl")]


def halted(out: Path) -> None:
    run, ckpt = out / "ckpt" / "rlgrad", out / "ckpt"
    log = (out / "launch.log").read_text(errors="replace")
    if verl_steps(out / "launch.log") != [1, 2]:
        fail(f"verl printed steps {verl_steps(out / 'launch.log')}, expected [1, 2] (the doctor stops after step 2)")
    critical = [f for f in said(run) if f[2] == "critical"]
    if critical != [(2, "kl_blowup", "critical")]:
        fail(f"doctor.jsonl's critical findings {critical}, expected [(2, 'kl_blowup', 'critical')]")
    for text in ("[doctor] step 2: CRITICAL kl_blowup", "rlgrad: stopped by the doctor after step 2",
                 "resumes from verl's global_step_2", f"rlgrad doctor {run}"):
        if text not in log:
            fail(f"launch.log does not say '{text}'")
    if not (ckpt / "global_step_2" / "actor" / "model_world_size_1_rank_0.pt").is_file():
        fail("no verl checkpoint global_step_2 with actor weights (the halt must save it)")
    if (ckpt / "global_step_1").exists():
        fail("global_step_1 exists: trainer.save_freq=10 should have saved nothing before the halt")
    if (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() != "2":
        fail("latest_checkpointed_iteration.txt is not 2")
    logged = {r["step"]: r["data"] for r in rows(out / "launch.jsonl")}
    cost = [logged.get(s, {}).get("timing_s/doctor") for s in (1, 2)]
    if None in cost:
        fail(f"timing_s/doctor missing from verl's logged steps 1-2: {cost}")
    step_s = [logged[s]["timing_s/step"] for s in (1, 2)]
    print(f"[verl_launch] ok: stopped by the doctor after step 2 (exit 3): kl_blowup critical in doctor.jsonl, "
          f"checkpoint global_step_2 saved by the halt; timing_s/doctor {cost[0]:.4f} s, {cost[1]:.4f} s "
          f"(steps {step_s[0]:.1f} s, {step_s[1]:.1f} s)")


def halt_resumed(out: Path) -> None:
    run, ckpt = out / "ckpt" / "rlgrad", out / "ckpt"
    printed = verl_steps(out / "resume.log")
    if printed != [3]:
        fail(f"the resumed launch printed steps {printed}, expected [3] (continuing after global_step_2)")
    if "global_step_2" not in (out / "resume.log").read_text(errors="replace"):
        fail("the resumed launch's log does not name global_step_2")
    kl = [f for f in said(run) if f[1] == "kl_blowup"]
    if kl != [(2, "kl_blowup", "critical")]:
        fail(f"doctor.jsonl's kl_blowup lines {kl}: a finding already said must not be said (or halt) again")
    steps = [r["step"] for r in rows(run / "metrics.jsonl")]
    if steps != [1, 2, 3]:
        fail(f"metrics.jsonl steps {steps}, expected [1, 2, 3]")
    if not (ckpt / "global_step_3" / "actor" / "model_world_size_1_rank_0.pt").is_file():
        fail("no checkpoint global_step_3 (verl saves the last step)")
    if (run / "doctor_halt.json").exists():
        fail("doctor_halt.json left by a launch that was not stopped")
    print(f"[verl_launch] ok: the same command resumed from global_step_2, ran step 3 only and ended (exit 0); "
          f"doctor.jsonl: {said(run)}")


if __name__ == "__main__":
    {"first": first, "resume": resume, "halted": halted, "halt_resumed": halt_resumed}[sys.argv[1]](Path(sys.argv[2]))
