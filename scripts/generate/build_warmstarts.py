"""Build the warm starts of the embedded default that rlgrad ships (src/rlgrad/warmstarts/), one per (task,
warm-start settings) that a preset or an example uses with the embedded default, so that a first run starts in
seconds instead of training for minutes.

    python scripts/generate/build_warmstarts.py            # build the missing ones
    python scripts/generate/build_warmstarts.py --list     # which settings need one, and whether it is shipped
    python scripts/generate/build_warmstarts.py --check arithmetic  # rebuild one in full, compare with the shipped one

Each file comes with a record (``<stem>.json``): the digest of its weights and of the first ``PREFIX_STEPS``
steps of its build, which ``tests/test_warmstarts.py`` rebuilds in seconds (a full rebuild takes minutes).

A warm start is a function of its settings (``rlgrad.models.warmstart_key``: the architecture, the task and its
environment, seed, steps, learning rate, batch size), so a changed preset needs a rebuild: ``--list`` says so and
``tests/test_warmstarts.py`` fails until it is done.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

import torch

from rlgrad.config.load import load_config, presets
from rlgrad.config.schema import RLGradConfig
from rlgrad.errors import UserError
from rlgrad.models import SHIPPED_WARMSTARTS, build_warmstart, warmstart_key
from rlgrad.tasks import task_from_config

REAL_MODEL_PRESETS = {"smollm2_chain_sum"}  # run with model.path=<the SmolLM2 .gguf>, never the embedded default


def example_configs() -> list[tuple[str, RLGradConfig]]:
    """The examples' settings: examples/trl_grpo.py and examples/custom_loop.py use the default arithmetic task."""
    return [("examples", load_config())]


def needed() -> dict[str, tuple[str, RLGradConfig, object, int]]:
    """``{file stem: (first user, config, task, seed)}`` for every warm start the presets and examples use."""
    out: dict[str, tuple[str, RLGradConfig, object, int]] = {}
    users = example_configs()
    for name, _ in presets():
        try:
            users.append((name, load_config(preset=name)))
        except UserError:  # a preset that needs the user's data or model (math files, a .gguf path)
            continue
    for user, cfg in users:
        if cfg.model.path or user in REAL_MODEL_PRESETS:
            continue
        task = task_from_config(cfg)
        seed = cfg.trainer.seed if cfg.model.warmstart_seed is None else cfg.model.warmstart_seed
        spec = task.warmstart_spec() if hasattr(task, "warmstart_spec") else None
        stem = f"{task.name}-{warmstart_key(cfg.model, task.name, seed, spec)}"
        out.setdefault(stem, (user, cfg, task, seed))
    return out


PREFIX_STEPS = 20  # the checkable start of each warm start (tests/test_warmstarts.py rebuilds it)


def build(cfg: RLGradConfig, task, seed: int, stop_after: int | None = None,
          device: str = "cpu") -> dict[str, torch.Tensor]:
    """One warm start (or its first ``stop_after`` steps), on one thread: the sums then run in one order whatever
    the machine's core count, so a rebuild is bitwise the same. ``device="cuda"`` builds a long one in a minute
    instead of an hour, for trying settings; it is then reproducible on that kind of GPU, not bitwise on a CPU,
    so the shipped files are all built on the CPU (issue 47)."""
    torch.set_num_threads(1)
    model, _ = build_warmstart(cfg.model, task, seed, log=lambda msg: print(msg, flush=True), stop_after=stop_after,
                               device=device)
    model = model.cpu()
    # tied embeddings are one tensor under two names: safetensors stores it once, under its first name
    state = model.state_dict()
    first = {v.data_ptr(): k for k, v in reversed(list(state.items()))}
    return {k: v.detach().clone() for k, v in state.items() if first[v.data_ptr()] == k}


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].numpy().tobytes())
    return h.hexdigest()


def cpu_kernels() -> str:
    """The vector kernels PyTorch picked on this CPU (``AVX2``, ``AVX512``, ...): training sums floats in their
    order, so a build's digest holds for one kind only."""
    return torch.backends.cpu.get_cpu_capability()


def record(stem: str) -> dict:
    path = SHIPPED_WARMSTARTS / f"{stem}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def main() -> int:
    from safetensors.torch import load_file, save_file

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the warm starts needed and whether each is shipped")
    ap.add_argument("--check", metavar="TASK", help="rebuild the shipped warm start(s) of TASK in full and compare")
    ap.add_argument("--only", metavar="TASK", help="build only the missing warm starts of TASK")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where to build the full warm start (the recorded prefix is always built on the CPU)")
    args = ap.parse_args()
    wanted = needed()
    if args.list:
        for stem, (user, cfg, _, _) in sorted(wanted.items()):
            state = "shipped" if (SHIPPED_WARMSTARTS / f"{stem}.safetensors").is_file() else "MISSING"
            print(f"{stem:40s} {state:8s} {cfg.model.warmstart_steps:5d} steps (first used by {user})")
        return 0
    SHIPPED_WARMSTARTS.mkdir(parents=True, exist_ok=True)
    bad = 0
    for stem, (user, cfg, task, seed) in sorted(wanted.items()):
        path = SHIPPED_WARMSTARTS / f"{stem}.safetensors"
        if args.check is not None:
            if stem.startswith(f"{args.check}-"):
                t0 = time.perf_counter()
                same = digest(build(cfg, task, seed)) == digest(load_file(path))
                print(f"{stem}: {'identical' if same else 'DIFFERENT'} ({time.perf_counter() - t0:.0f} s)")
                bad += not same
            continue
        if args.only and not stem.startswith(f"{args.only}-"):
            continue
        info = record(stem)
        if path.is_file():
            # The prefix's float sums depend on the CPU's vector kernels (AVX2, AVX512, ...): each kind of CPU that
            # checks it gets its own digest, recorded the first time the script runs there.
            by_cpu = info.setdefault("prefix_sha256_by_cpu", {})
            if cpu_kernels() not in by_cpu:
                prefix = digest(build(cfg, task, seed, stop_after=PREFIX_STEPS))
                by_cpu[cpu_kernels()] = prefix
                info.setdefault("prefix_sha256", prefix)
                info.update(sha256=digest(load_file(path)), prefix_steps=PREFIX_STEPS, threads=1,
                            torch=info.get("torch", torch.__version__.split("+")[0]))
                (SHIPPED_WARMSTARTS / f"{stem}.json").write_text(json.dumps(info, indent=1) + "\n")
                print(f"recorded the first {PREFIX_STEPS} steps of {stem} on {cpu_kernels()}")
            continue
        t0 = time.perf_counter()
        print(f"building {stem} ({cfg.model.warmstart_steps} steps, for {user}, on {args.device})", flush=True)
        state = build(cfg, task, seed, device=args.device)
        save_file(state, str(path))
        path.chmod(0o644)  # package data: readable by everyone, whatever the umask of safetensors' temp file
        info = {"settings": f"{task.name}, model.* of {user}", "seed": seed, "steps": cfg.model.warmstart_steps,
                "built_on": {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                             "torch": torch.__version__.split("+")[0], "threads": 1}}
        if args.device == "cpu":
            prefix = digest(build(cfg, task, seed, stop_after=PREFIX_STEPS))
            info.update(sha256=digest(state), prefix_steps=PREFIX_STEPS, threads=1, torch=info["built_on"]["torch"],
                        prefix_sha256=prefix, prefix_sha256_by_cpu={cpu_kernels(): prefix})
        (SHIPPED_WARMSTARTS / f"{stem}.json").write_text(json.dumps(info, indent=1) + "\n")
        print(f"  {path} ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.0f} s)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
