"""Kill-resume stress: SIGKILL ``rlgrad train`` at random moments after its first checkpoint (some of them while a
checkpoint is being written), resume with the same command, and check that the resumed run ends exactly where an
uninterrupted one does: the final actor weights bitwise, every metrics.jsonl row exactly once with the same values
(timings aside), and the same reward-component rows as ``read_reward_components`` reads them.

    python scripts/checks/kill_stress.py --attempts 10 --load     # the figures in docs/benchmarks.md

``--load`` starts a second training run that loads the CPU for the whole test (and is killed at the end). Each
attempt kills its run ``--kills`` times (its first launch, then each resume), the kinds of kill taken in turn
across attempts: "random", a random moment after the launch's first new checkpoint; "mid-write", while a
checkpoint is being written (a ``.global_step_N.tmp-*`` directory exists) after that; "startup", a random moment
of a resume before its first new checkpoint (a first launch gets "random" instead). A last launch then finishes
the run, also when a kill came after the last checkpoint (the same command must then exit 0). Also checked: the
rollout files, and that no killed save's leftovers remain.
Exit status 0 when every attempt passes, else 1. The run directories stay under ``--workdir`` for a look.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_SETTINGS = ["trainer.save_freq=1", "trainer.test_freq=3", "trainer.max_ckpt_to_keep=2", "trainer.logger=[jsonl]",
                "trainer.num_threads=1", "trainer.val_before_train=true"]


def train_command(run_dir: Path, steps: int) -> list[str]:
    """``rlgrad train`` on the embedded default (the tiny warm-started model), a checkpoint every step."""
    return [sys.executable, "-m", "rlgrad", "train", *RUN_SETTINGS, f"trainer.total_training_steps={steps}",
            f"trainer.default_local_dir={run_dir}"]


def launch(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)


def complete_checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[-1]) for p in run_dir.glob("global_step_*")
                  if p.name.split("_")[-1].isdigit() and (p / "COMPLETE").is_file())


def partial_saves(run_dir: Path) -> set[str]:
    return {p.name for p in run_dir.glob(".global_step_*.tmp-*")}


def wait_for(proc: subprocess.Popen, ready, poll_s: float = 0.002) -> bool:
    """Poll until ``ready()`` or the process ended; True when ready with the process still running."""
    while proc.poll() is None:
        if ready():
            return True
        time.sleep(poll_s)
    return False


def kill_once(proc: subprocess.Popen, run_dir: Path, mode: str, spans: tuple[float, float],
              rng: random.Random) -> str:
    """SIGKILL ``proc`` (a launch of the run in ``run_dir``) as ``mode`` says; what happened, in words.
    ``spans``: seconds from a launch to its first checkpoint, and from there to the end (the uninterrupted run's).
    random: a moment after the launch's first new checkpoint; mid-write: while a checkpoint is being written
    after that; startup: a moment before the launch's first new checkpoint (a resume's own start-up)."""
    had = max(complete_checkpoints(run_dir), default=0)
    stale = partial_saves(run_dir)  # an earlier kill's, until the resume removes them

    def writing_checkpoint() -> bool:
        return bool(partial_saves(run_dir) - stale)

    if mode == "startup" and had:
        time.sleep(rng.uniform(0, spans[0]))
    elif not wait_for(proc, lambda: max(complete_checkpoints(run_dir), default=0) > had, poll_s=0.02):
        return f"{mode}: finished before a new checkpoint"
    if mode == "mid-write":
        if not wait_for(proc, writing_checkpoint):
            return f"{mode}: finished before another checkpoint was written"
        time.sleep(rng.uniform(0, 0.05))
    elif mode == "random":
        time.sleep(rng.uniform(0, spans[1]))
    if proc.poll() is not None:
        return f"{mode}: finished before the kill"
    during = writing_checkpoint()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return (f"{mode}: killed with checkpoints {complete_checkpoints(run_dir)}"
            + (" while one was being written" if during else ""))


def weights(run_dir: Path, steps: int) -> dict:
    from safetensors.torch import load_file

    return load_file(run_dir / f"global_step_{steps}" / "actor" / "model.safetensors")


def raw_bytes(tensor):
    """The tensor's bytes (bitwise: NaN equals the same NaN, -0.0 differs from 0.0)."""
    import torch

    return tensor.contiguous().view(-1).view(torch.uint8)


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def reward_rows(run_dir: Path) -> list[dict]:
    """reward_components.jsonl as readers see it (the last line of each step), less its wall-clock timestamps."""
    sys.path.insert(0, str(REPO / "src"))
    from rlgrad.logging.rewards import read_reward_components

    return [{k: v for k, v in row.items() if k != "timestamp"}
            for row in read_reward_components(run_dir / "reward_components.jsonl")]


def rollout_files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (run_dir / "rollouts").glob("step_*.jsonl")}


def without_timings(row: dict) -> dict:
    return {"step": row["step"], "data": {k: v for k, v in row["data"].items() if not k.startswith("timing_s/")}}


def compare(ref: Path, run: Path, steps: int) -> list[str]:
    """What differs between the uninterrupted run ``ref`` and the killed-and-resumed ``run`` (empty: nothing)."""
    import torch

    faults = []
    a, b = weights(ref, steps), weights(run, steps)
    if a.keys() != b.keys():
        faults.append("the final checkpoints hold different tensors")
    bad = [k for k in a if k in b and (a[k].dtype != b[k].dtype or a[k].shape != b[k].shape
                                       or not torch.equal(raw_bytes(a[k]), raw_bytes(b[k])))]
    if bad:
        faults.append(f"{len(bad)} tensor(s) differ bitwise, e.g. {bad[0]}")
    try:
        got, want = metric_rows(run), metric_rows(ref)
    except json.JSONDecodeError as e:
        return [*faults, f"metrics.jsonl holds a line that does not parse ({e})"]
    steps_got = [r["step"] for r in got]
    if steps_got != list(range(steps + 1)):
        faults.append(f"metrics.jsonl steps are {steps_got}, not 0..{steps} once each")
    elif [without_timings(r) for r in got] != [without_timings(r) for r in want]:
        differ = [r["step"] for r, s in zip(got, want) if without_timings(r) != without_timings(s)]
        faults.append(f"metrics.jsonl rows differ from the uninterrupted run's at steps {differ}")
    if reward_rows(run) != reward_rows(ref):
        faults.append("reward_components.jsonl (last line of each step) differs from the uninterrupted run's")
    if rollout_files(run) != rollout_files(ref):
        faults.append("rollouts/step_N.jsonl differ from the uninterrupted run's")
    left = [p.name for p in run.glob("*global_step_*") if not p.name.split("_")[-1].isdigit()]
    if left:
        faults.append(f"a killed save's leftovers remain: {left}")
    return faults


MODES = ("random", "mid-write", "startup")


def attempt(index: int, args, ref: Path, spans: tuple[float, float], rng: random.Random) -> tuple[bool, list[str]]:
    run_dir = args.workdir / f"attempt_{index}"
    log = args.workdir / f"attempt_{index}.log"
    cmd = train_command(run_dir, args.steps)
    notes = []
    for k in range(args.kills):
        mode = MODES[(index + k) % len(MODES)]  # each mode in turn; a first launch has no resume to start up
        proc = launch(cmd, log)
        notes.append(kill_once(proc, run_dir, "random" if mode == "startup" and k == 0 else mode, spans, rng))
        if proc.returncode not in (-signal.SIGKILL, None):
            if proc.returncode != 0:
                return False, [*notes, f"a launch exited {proc.returncode} (see {log})"]
            break
    proc = launch(cmd, log)
    proc.wait()
    if proc.returncode != 0:
        return False, [*notes, f"resume failed: exit {proc.returncode} (see {log})"]
    faults = compare(ref, run_dir, args.steps)
    return not faults, notes + faults


def start_load(args) -> subprocess.Popen | None:
    if not args.load:
        return None
    load_dir = args.workdir / "load"
    cmd = [*train_command(load_dir, 100000)[:-2], "trainer.total_training_steps=100000", "trainer.save_freq=20",
           f"trainer.default_local_dir={load_dir}"]
    return launch(cmd, args.workdir / "load.log")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attempts", type=int, default=10)
    p.add_argument("--steps", type=int, default=8, help="training steps of each run (a checkpoint every step)")
    p.add_argument("--kills", type=int, default=2, help="SIGKILLs per attempt before the final resume")
    p.add_argument("--load", action="store_true", help="load the CPU with a second training run meanwhile")
    p.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    p.add_argument("--workdir", type=Path, default=None, help="where the runs go (default: a new temp dir)")
    args = p.parse_args()
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="rlgrad-kill-stress-"))).resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    load = start_load(args)
    try:
        ref = args.workdir / "uninterrupted"
        shutil.rmtree(ref, ignore_errors=True)
        t_ref = time.monotonic()
        proc = launch(train_command(ref, args.steps), args.workdir / "uninterrupted.log")
        wait_for(proc, lambda: bool(complete_checkpoints(ref)), poll_s=0.05)
        t_first = time.monotonic()
        if proc.wait() != 0:
            print(f"the uninterrupted run failed (see {args.workdir / 'uninterrupted.log'})")
            return 1
        spans = (t_first - t_ref, time.monotonic() - t_first)  # where the kill moments spread
        print(f"uninterrupted run: {sum(spans):.1f} s ({spans[1]:.1f} s after its first checkpoint)", flush=True)
        passed, loads = 0, []
        for i in range(1, args.attempts + 1):
            shutil.rmtree(args.workdir / f"attempt_{i}", ignore_errors=True)
            t_a = time.monotonic()
            ok, notes = attempt(i, args, ref, spans, rng)
            passed += ok
            loads.append(os.getloadavg()[0])
            print(f"attempt {i}: {'PASS' if ok else 'FAIL'} ({time.monotonic() - t_a:.0f} s, load {loads[-1]:.1f}) "
                  + "; ".join(notes), flush=True)
    finally:
        if load is not None:
            os.kill(load.pid, signal.SIGKILL)
            load.wait()
    print(f"{passed}/{args.attempts} passed in {time.monotonic() - t0:.0f} s on {os.cpu_count()} cores"
          + (" with a second training run loading them" if args.load else "")
          + (f"; 1-min load average after each attempt {min(loads):.1f} to {max(loads):.1f}" if loads else "")
          + f"; runs in {args.workdir}")
    return 0 if passed == args.attempts else 1


if __name__ == "__main__":
    sys.exit(main())
