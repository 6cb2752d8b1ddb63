"""The warm starts rlgrad ships (src/rlgrad/warmstarts): one for every preset and example that uses the embedded
default, each what scripts/generate/build_warmstarts.py makes, and a cache that one process builds while others wait."""

import hashlib
import multiprocessing as mp
import os

import pytest

from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.models import SHIPPED_WARMSTARTS, embedded_default, warmstart_key
from rlgrad.tasks import build_task
from tests.helpers.scripts import load_script


def script():
    return load_script("scripts/generate/build_warmstarts.py")


def test_every_preset_and_example_has_its_warm_start_shipped():
    wanted = script().needed()
    assert {stem.split("-")[0] for stem in wanted} >= {"arithmetic", "countdown", "sokoban", "frozen_lake"}
    missing = [stem for stem in wanted if not (SHIPPED_WARMSTARTS / f"{stem}.safetensors").is_file()]
    assert not missing, f"run: python scripts/generate/build_warmstarts.py (missing {missing})"
    extra = {p.stem for p in SHIPPED_WARMSTARTS.glob("*.safetensors")} - set(wanted)
    assert not extra, f"shipped warm starts no preset uses: {extra}"


# the agents' prefixes (25 s and 11 s here: their episodes are longer) run with the end-to-end checks, out of the
# suite's 6 CPU-minutes
@pytest.mark.parametrize("task_name", ["arithmetic", "countdown", pytest.param("sokoban", marks=pytest.mark.e2e),
                                       pytest.param("frozen_lake", marks=pytest.mark.e2e)])
def test_each_shipped_warm_start_is_what_the_script_builds(task_name):
    """The file's digest is its record's, and the first steps of the script's build, rebuilt here, are the ones
    recorded when the file was made (a full rebuild, ``--check``, takes minutes: docs/benchmarks.md)."""
    import torch
    from safetensors.torch import load_file

    mod = script()
    for stem, (_, cfg, task, seed) in mod.needed().items():
        if not stem.startswith(f"{task_name}-"):
            continue
        info = mod.record(stem)
        assert mod.digest(load_file(SHIPPED_WARMSTARTS / f"{stem}.safetensors")) == info["sha256"]
        if info["torch"] != torch.__version__.split("+")[0]:
            pytest.skip(f"recorded with torch {info['torch']}: float sums may differ on {torch.__version__}")
        threads = torch.get_num_threads()
        try:
            got = mod.digest(mod.build(cfg, task, seed, stop_after=info["prefix_steps"]))
        finally:
            torch.set_num_threads(threads)
        by_cpu = info.get("prefix_sha256_by_cpu", {})
        if mod.cpu_kernels() in by_cpu:
            assert got == by_cpu[mod.cpu_kernels()]
        elif got != info["prefix_sha256"]:  # recorded on another kind of CPU only
            pytest.skip(f"no prefix digest recorded for this CPU's kernels ({mod.cpu_kernels()}; recorded: "
                        f"{sorted(by_cpu) or 'kind not noted'}): run scripts/generate/build_warmstarts.py here")


def test_a_shipped_warm_start_is_used_without_training(tmp_path):
    said = []
    task = build_task("arithmetic", val_size=8)
    cfg = ModelConfig(cache_dir=str(tmp_path))
    path = embedded_default(cfg, task, seed=0, log=said.append)
    assert not any("building" in s for s in said), said
    key = warmstart_key(cfg, task.name, cfg.warmstart_seed)
    from safetensors.torch import load_file

    shipped = load_file(SHIPPED_WARMSTARTS / f"arithmetic-{key}.safetensors")
    loaded = load_file(path / "model.safetensors")
    assert all((loaded[k] == v).all() for k, v in shipped.items())


SMALL = dict(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=64), warmstart_steps=30, warmstart_batch_size=8)


def _build(cache: str, out) -> None:
    said = []
    path = embedded_default(ModelConfig(cache_dir=cache, **SMALL), build_task("arithmetic", val_size=4), 0,
                            log=said.append)
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    out.put((os.getpid(), digest, any(s.startswith("building") for s in said), any("waiting" in s for s in said)))


@pytest.mark.e2e  # several processes: in scripts/test_e2e.sh, out of the suite's 6 CPU-minutes
def test_two_runs_build_one_warm_start(tmp_path):
    ctx = mp.get_context("spawn")  # fork after torch started its threads can deadlock
    out = ctx.Queue()
    procs = [ctx.Process(target=_build, args=(str(tmp_path), out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert len({r[1] for r in results}) == 1  # the same weights
    assert sum(r[2] for r in results) == 1  # built once
    assert len(list((tmp_path / "warmstart").glob("arithmetic-*.lock"))) == 1


def test_the_sokoban_demo_warm_start_reads_the_board(tmp_path):
    """The demo needs a warm start that imitates its sloppy planner: the right first move wherever the solution
    does not start with Up (the planner's systematic slip, which RL is there to fix). A model that learnt only
    how often each word comes writes Left everywhere: about 40% right on those rooms, and RL has nothing to
    build on (scripts/checks/sokoban_warmstart_probe.py, on the first turn of 64 validation rooms)."""
    from rlgrad.config.load import load_config
    from rlgrad.models import load_pretrained
    from rlgrad.tasks import task_from_config

    probe = load_script("scripts/checks/sokoban_warmstart_probe.py")
    cfg = load_config(preset="sokoban_demo", overrides=[f"model.cache_dir={tmp_path}", "data.val_size=64"])
    task = task_from_config(cfg)
    model, tokenizer = load_pretrained(embedded_default(cfg.model, task, cfg.trainer.seed, log=lambda *a: None))
    got = probe.first_moves(model, tokenizer, cfg, task)
    assert got["right"] >= 0.6 and len(got["written"]) >= 3, got
