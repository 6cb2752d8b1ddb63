import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]


def tiny_overrides(cache_dir: Path, run_dir: Path | None = None) -> list[str]:
    """A tiny, fast configuration: a 2-block width-32 Qwen2 with a few SFT steps."""
    out = [
        f"model.cache_dir={cache_dir}", "model.warmstart_steps=5", "model.warmstart_batch_size=16",
        "model.tiny.hidden_size=32", "model.tiny.num_hidden_layers=2", "model.tiny.num_attention_heads=2",
        "model.tiny.num_key_value_heads=1", "model.tiny.intermediate_size=64",
        "data.train_batch_size=4", "rollout.n=4", "rollout.response_length=4", "data.val_size=8",
        "actor.ppo_micro_batch_size=8", "trainer.logger=[jsonl]", "trainer.num_threads=1",
        "actor.optim.lr=1e-3",
    ]
    if run_dir is not None:
        out.append(f"trainer.default_local_dir={run_dir}")
    return out


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model_cache")


@pytest.fixture
def tiny(model_cache, tmp_path):
    """Overrides for a tiny run in a fresh run directory ``tmp_path / 'run'``."""
    return tiny_overrides(model_cache, tmp_path / "run")


def run_cli(args: list[str], cwd: Path | None = None, env: dict | None = None, timeout: int = 300):
    import subprocess

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "rlgrad", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
