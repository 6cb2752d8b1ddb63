"""The CUDA path, checked on a machine with a GPU (nothing in the test suite needs one).

Run from the repository root: ``PYTHONPATH=src python scripts/checks/cuda_check.py [--out DIR]``. It checks, on
``cuda``:

1. the gradient engine: every bucket's slice gradients from the fast (hook) path equal the reference path
   (one backward per bucket) on the GPU, and equal the CPU's to float32 round-off; the per-sample norms equal the
   CPU's and one backward per row (``tests.helpers.per_row``) on the GPU;
2. ``rlgrad train`` with ``trainer.device=cuda`` and every instrument on: it runs, logs finite metrics, and a run
   stopped after its checkpoint and resumed ends with the same weights as an uninterrupted one (the CUDA RNG state
   is part of the checkpoint).

It prints one line per check and exits 1 if any fails. Figures from a run go in the closing note of the work that
needed them; the script is not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tests.helpers: the engine tests' tiny model and batch

from rlgrad.algos.objective import as_loss_fn  # noqa: E402
from rlgrad.analysis.buckets import analyse_buckets  # noqa: E402
from tests.helpers.batches import SETTINGS, make_batch, tiny_model_and_tokenizer  # noqa: E402
from tests.helpers.per_row import per_row_gradients  # noqa: E402

FAILED: list[str] = []
DEVICE = "cuda"  # --device cpu: a dry run of the script itself on a machine without a GPU


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILED.append(name)


def max_rel(a: dict[str, float], b: dict[str, float]) -> float:
    """Largest relative difference over the metrics both hold (scale: the larger magnitude, floored at 1e-6)."""
    keys = [k for k in a if k in b and isinstance(a[k], float) and isinstance(b[k], float)]
    return max((abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k]), 1e-6) for k in keys), default=0.0)


def engine_checks() -> None:
    model, tok = tiny_model_and_tokenizer()
    batch = make_batch(model, tok)
    for i, settings in enumerate(SETTINGS):
        cpu = analyse_buckets(model, batch, settings, num_buckets=3, method="fast").metrics
        gpu_model = model.to(DEVICE)
        gpu_batch = batch.to(DEVICE)
        fast = analyse_buckets(gpu_model, gpu_batch, settings, num_buckets=3, method="fast").metrics
        ref = analyse_buckets(gpu_model, gpu_batch, settings, num_buckets=3, method="reference").metrics
        model.to("cpu")
        check(f"engine settings[{i}] {DEVICE} fast == {DEVICE} reference", max_rel(fast, ref) < 1e-4,
              f"max rel {max_rel(fast, ref):.2e}")
        check(f"engine settings[{i}] {DEVICE} == cpu", max_rel(fast, cpu) < 1e-3, f"max rel {max_rel(fast, cpu):.2e}")


def lora_engine_checks() -> None:
    from tests.helpers.lora import lora_model

    model, tok = tiny_model_and_tokenizer()
    adapted = lora_model(model)
    batch = make_batch(adapted, tok)
    cpu = analyse_buckets(adapted, batch, SETTINGS[0], num_buckets=3, method="fast").metrics
    adapted.to(DEVICE)
    fast = analyse_buckets(adapted, batch.to(DEVICE), SETTINGS[0], num_buckets=3, method="fast").metrics
    ref = analyse_buckets(adapted, batch.to(DEVICE), SETTINGS[0], num_buckets=3, method="reference").metrics
    check(f"LoRA engine {DEVICE} fast == {DEVICE} reference", max_rel(fast, ref) < 1e-4,
          f"max rel {max_rel(fast, ref):.2e}")
    check(f"LoRA engine {DEVICE} == cpu", max_rel(fast, cpu) < 1e-3, f"max rel {max_rel(fast, cpu):.2e}")


def per_sample_checks() -> None:
    from rlgrad.analysis.per_sample import analyse_per_sample

    model, tok = tiny_model_and_tokenizer()
    batch = make_batch(model, tok)  # stays on the CPU, as the trainer's batch does
    cpu = analyse_per_sample(model, batch, SETTINGS[0], num_buckets=3, proxy=True)
    gpu = analyse_per_sample(model.to(DEVICE), batch, SETTINGS[0], num_buckets=3, proxy=True)
    model.to("cpu")
    worst = max(float(((gpu.norms[t].cpu() - cpu.norms[t]).abs() / cpu.norms[t].abs().clamp_min(1e-12)).max())
                for t in cpu.norms)
    check(f"per-sample norms {DEVICE} == cpu", worst < 1e-3, f"max rel {worst:.2e}")
    check(f"noise metrics {DEVICE} == cpu", max_rel(gpu.metrics, cpu.metrics) < 1e-2,
          f"max rel {max_rel(gpu.metrics, cpu.metrics):.2e}")
    # the ghost norms against one backward per row, both on the device, for every loss setting and term
    model.to(DEVICE)
    for index, settings in enumerate(SETTINGS):
        rep = analyse_per_sample(model, batch.to(DEVICE), settings, num_buckets=3)
        oracle = per_row_gradients(model, batch.to(DEVICE), as_loss_fn(settings))
        worst = max(float((rep.norms[t].double().cpu() - g.norm(dim=1).cpu()).abs().max()
                          / g.norm(dim=1).abs().max().clamp_min(1e-30)) for t, g in oracle.items())
        check(f"per-sample settings[{index}] {DEVICE} == per-row autograd on {DEVICE}", worst < 1e-4,
              f"max rel {worst:.2e}, terms {sorted(oracle)}")
    model.to("cpu")


def train_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlgrad", "train", "--config-name", "demo", f"trainer.device={DEVICE}",
            f"trainer.default_local_dir={run_dir}", "trainer.total_training_steps=6", "trainer.save_freq=3",
            "trainer.test_freq=3", "analysis.every=3", *extra]


def last_line(text: str) -> str:
    """The error's line, and the traceback above it when there is one (to fix it without a second GPU run)."""
    lines = text.strip().splitlines()
    if any(line.startswith("Traceback") for line in lines):
        return "\n".join(lines[-30:])
    return lines[-1] if lines else ""


def trainer_checks(tmp: Path) -> None:
    whole = subprocess.run(train_cmd(tmp / "whole"), capture_output=True, text=True, cwd=ROOT, timeout=900)
    check(f"rlgrad train on {DEVICE}, every instrument at steps 1 and 4", whole.returncode == 0,
          last_line(whole.stderr))
    # SIGKILL once the step-3 checkpoint is complete, then resume: the CUDA RNG state travels in the checkpoint.
    killed = tmp / "killed"
    proc = subprocess.Popen(train_cmd(killed), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while not (killed / "global_step_3" / "COMPLETE").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    again = subprocess.run(train_cmd(killed), capture_output=True, text=True, cwd=ROOT, timeout=900)
    check("SIGKILL after the step-3 checkpoint, then resume", again.returncode == 0, last_line(again.stderr))
    if whole.returncode or again.returncode:
        return
    from safetensors.torch import load_file

    def final(d: Path) -> dict[str, torch.Tensor]:
        files = sorted((d / "global_step_6").rglob("*.safetensors"))
        return {k: v for f in files for k, v in load_file(str(f)).items()}

    a, b = final(tmp / "whole"), final(killed)
    same = bool(a) and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    check("resumed weights equal uninterrupted (bitwise)", same, f"{len(a)} tensors")
    lora = subprocess.run(train_cmd(tmp / "lora", "actor.lora.rank=4", "trainer.total_training_steps=3"),
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    adapter = tmp / "lora" / "global_step_3" / "actor" / "adapter_model.safetensors"
    check(f"LoRA run on {DEVICE} (actor.lora.rank=4), adapter saved", lora.returncode == 0 and adapter.exists(),
          last_line(lora.stderr))
    metrics = [json.loads(x)["step"] for x in (killed / "metrics.jsonl").read_text().splitlines() if x.strip()]
    check("metric rows once each after the resume", metrics == sorted(set(metrics)), str(metrics))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of this script")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}")
    engine_checks()
    lora_engine_checks()
    per_sample_checks()
    with tempfile.TemporaryDirectory() as tmp:
        trainer_checks(Path(args.out) if args.out else Path(tmp))
    print(f"{len(FAILED)} failed" if FAILED else "all checks passed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
