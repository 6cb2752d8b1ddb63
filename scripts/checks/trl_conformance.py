#!/usr/bin/env python
"""TRL's own GRPOTrainer tests as a conformance suite for rlgrad's subclass (docs/trl_conformance.md).

Runs TRL's ``tests/test_grpo_trainer.py`` twice, offline: against TRL's ``GRPOTrainer`` and against
``rlgrad.integrations.trl.GRPOTrainer`` (the copied test file's ``from trl import ... GRPOTrainer`` is rewritten to
import the subclass; nothing in TRL is patched). Every test that passes with TRL's trainer must pass with the
subclass, or fail on a refusal of rlgrad's (a one-line ``rlgrad.errors.UserError``, listed for the README check).
Exit status 0 when that holds, 1 when a test regresses otherwise, 2 on bad input.

TRL's tests load tiny models and datasets from the hub (``trl-internal-testing/...``). They are built here, as TRL's
generator scripts build them, with local stand-ins for what those scripts download: a character tokenizer with a
ChatML chat template in place of Qwen2.5's tokenizer, and the Zen of Python (``import this``) split as TRL's zen
dataset splits it. The copied test file names their local directories instead of the hub ids. Tests that name
any other hub model or dataset (vision models, MoE, other architectures) are deselected and counted as such.

TRL's tests are not in its PyPI sdist (``pip download --no-deps --no-binary :all: trl==VERSION`` holds only the
package), so ``--trl-src`` names a TRL source tree at the installed release (``git clone --branch vVERSION`` of
TRL's repository) or a git directory of it (``--rev`` picks the commit; default ``vVERSION``).

    python scripts/checks/trl_conformance.py --trl-src ~/src/trl                  # both runs
    python scripts/checks/trl_conformance.py --trl-src trl.git --rev HEAD -k reward_model --only rlgrad
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_FILES = ("tests/__init__.py", "tests/conftest.py", "tests/testing_utils.py", "tests/test_grpo_trainer.py")
HUB = "trl-internal-testing/"
CAUSAL, REWARD = "tiny-Qwen2ForCausalLM-2.5", "tiny-Qwen2ForSequenceClassification-2.5"
ZEN = "zen"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # Qwen2.5's: pad, and the ChatML turn markers
# ChatML, as Qwen2.5 writes a conversation (no system prompt unless given); the generation prompt opens a turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# The refusals docs/integrations.md documents ("Inside TRL's GRPOTrainer": a setting the instruments cannot follow
# exactly); any other error of rlgrad's in a test that TRL's trainer passes is a regression.
DOCUMENTED_REFUSALS = ("rlgrad's instruments cannot follow TRL's loss exactly with",)

PLUGIN = '''
"""pytest plugin of scripts/checks/trl_conformance.py: deselects the tests that need a hub model or dataset without a
local stand-in (a hub id left in the copied test file, in the test's body or its parameters)."""
import inspect

HUB = "trl-internal-testing/"


def _needs_hub(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(HUB in str(v) for v in params.values()):
        return True
    fn = getattr(item, "function", None)
    try:
        body = inspect.getsource(fn).split("def ", 1)[1] if fn is not None else ""
    except (OSError, TypeError, IndexError):
        return False
    return HUB in body


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for it in items:
        (drop if _needs_hub(it) else keep).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    with open(config.getoption("--conformance-deselected"), "w") as f:
        f.write("\\n".join(it.nodeid for it in drop))


def pytest_addoption(parser):
    parser.addoption("--conformance-deselected", default="deselected.txt")
'''


def fail(msg: str) -> None:
    print(f"trl_conformance: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- TRL's tests


def sdist_has_tests(version: str, work: Path) -> bool:
    """Whether TRL's sdist on the package index carries tests/ (1.16.0's does not)."""
    d = work / "sdist"
    d.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"trl=={version}", "-d", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        return False
    import tarfile

    for f in d.glob(f"trl-{version}.tar.gz"):
        with tarfile.open(f) as tar:
            return any("/tests/test_grpo_trainer.py" in n for n in tar.getnames())
    return False


def copy_tests(src: Path, rev: str | None, version: str, dest: Path) -> dict:
    """TRL's test files into ``dest/tests``, from a source tree or (with ``rev``) a git directory."""
    (dest / "tests").mkdir(parents=True, exist_ok=True)
    if (src / "tests" / "test_grpo_trainer.py").is_file() and rev is None:
        for f in TEST_FILES:
            shutil.copy(src / f, dest / f)
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True)
        return {"source": str(src), "commit": head.stdout.strip() or None}
    rev = rev or f"v{version}"
    git = ["git", "--git-dir", str(src / ".git" if (src / ".git").exists() else src)]
    commit = subprocess.run([*git, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True, text=True)
    if commit.returncode != 0:
        fail(f"'{src}' has no revision '{rev}' (TRL {version}'s tag): fetch it, or pass --rev (another commit's tests)")
    for f in TEST_FILES:
        text = subprocess.run([*git, "show", f"{rev}:{f}"], capture_output=True, text=True)
        if text.returncode != 0:
            fail(f"'{src}' at {rev} has no {f}")
        (dest / f).write_text(text.stdout)
    ver = subprocess.run([*git, "show", f"{rev}:VERSION"], capture_output=True, text=True).stdout.strip()
    return {"source": str(src), "rev": rev, "commit": commit.stdout.strip(), "version_file": ver or None}


def rewrite(test_file: Path, hub: Path, subclass: bool) -> None:
    """The local stand-ins for the hub ids; with ``subclass``, rlgrad's trainer in place of TRL's."""
    s = test_file.read_text()
    for name in (CAUSAL, REWARD, ZEN):
        s = s.replace(f'"{HUB}{name}"', f'"{hub / name}"')
    line = "from trl import GRPOConfig, GRPOTrainer\n"
    if line not in s:
        fail(f"{test_file.name} does not import GRPOTrainer as '{line.strip()}': update this script")
    if subclass:
        s = s.replace(line, "from trl import GRPOConfig\nfrom rlgrad.integrations.trl import GRPOTrainer\n", 1)
    test_file.write_text(s)


def adapt_utils(utils: Path) -> list[str]:
    """The ``is_*_available`` checks TRL's test helpers import that the installed TRL lacks: each is removed from the
    import and reads False (the tests it gates are skipped). Only needed when the tests are not the release's own
    (``--rev`` another commit); returns the names, for the record."""
    import trl.import_utils as iu

    s = utils.read_text()
    m = re.search(r"from trl\.import_utils import \(([^)]*)\)", s)
    if m is None:
        return []
    names = [x.strip() for x in m.group(1).split(",") if x.strip()]
    missing = [x for x in names if not hasattr(iu, x)]
    if missing:
        kept = "".join(f"    {x},\n" for x in names if x not in missing)
        shims = "".join(f"\n\ndef {x}(*args, **kwargs):  # not in the installed TRL\n    return False\n"
                        for x in missing)
        s = s[:m.start()] + f"from trl.import_utils import (\n{kept})" + shims + s[m.end():]
        utils.write_text(s)
    return missing


# ---------------------------------------------------------------- the stand-ins


def build_hub(hub: Path) -> None:
    """The two tiny Qwen2 models and the zen dataset, as TRL's generator scripts build them, in ``hub``."""
    if (hub / "done").is_file():
        return
    import codecs
    import this  # noqa: F401  (the Zen of Python; importing it prints it once)

    import torch
    from datasets import Dataset
    from torch import nn
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    from rlgrad.models import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.pad_token, tok.eos_token = "<|endoftext|>", "<|im_end|>"
    tok.chat_template = CHAT_TEMPLATE
    ids = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id, "bos_token_id": None}

    def init(model: nn.Module) -> nn.Module:  # TRL's init_weights_tiny_model: no NaN from uninitialised weights
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.02)
        return model.to(torch.bfloat16)

    torch.manual_seed(0)
    dims = dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=32)
    lm = init(Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=8, **dims, **ids)))
    rm = init(Qwen2ForSequenceClassification(Qwen2Config(vocab_size=len(tok), hidden_size=16, num_labels=1, **dims,
                                                         **ids)))
    for name, model in ((CAUSAL, lm), (REWARD, rm)):
        model.save_pretrained(hub / name)
        tok.save_pretrained(hub / name)
        GenerationConfig(**ids).save_pretrained(hub / name)
    # The zen dataset's prompt-only configs: each aphorism's opening words, 10% of them the test split (unshuffled).
    zen = [x.strip() for x in codecs.decode(sys.modules["this"].s, "rot13").splitlines()[2:] if x.strip()]
    prompts = [" ".join(x.split()[:max(1, len(x.split()) // 2)]) for x in zen]
    configs = {"standard_prompt_only": {"prompt": prompts},
               "conversational_prompt_only": {"prompt": [[{"role": "user", "content": p}] for p in prompts]}}
    card = ["---", "configs:"]
    for cfg, cols in configs.items():
        split = Dataset.from_dict(cols).train_test_split(test_size=0.1, shuffle=False)
        card += [f"- config_name: {cfg}", "  data_files:"]
        for part, ds in split.items():
            ds.to_parquet(str(hub / ZEN / cfg / f"{part}.parquet"))
            card += [f"  - split: {part}", f"    path: {cfg}/{part}.parquet"]
    (hub / ZEN / "README.md").write_text("\n".join(card + ["---", ""]))
    (hub / "done").write_text("")


# ---------------------------------------------------------------- the runs


def run_suite(work: Path, name: str, pytest_args: list[str], timeout: int) -> dict:
    d = work / name
    xml = d / "junit.xml"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "CUDA_VISIBLE_DEVICES": "", "WANDB_DISABLED": "true", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(d), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "tests/test_grpo_trainer.py", "-p", "conformance_plugin",
           "-p", "no:cacheprovider", "-q", "-rN", "--junitxml", str(xml),
           "--conformance-deselected", str(d / "deselected.txt"), *pytest_args]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True, timeout=timeout)
        (d / "pytest.log").write_text(r.stdout + r.stderr)
    except subprocess.TimeoutExpired:
        fail(f"the {name} run passed its {timeout} s limit (--timeout; or run a subset with -k)")
    seconds = time.time() - t0
    if not xml.is_file():
        fail(f"the {name} run wrote no report; see {d / 'pytest.log'}")
    cases = {}
    for tc in ET.parse(xml).getroot().iter("testcase"):
        nodeid = f"{tc.get('classname')}::{tc.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or "").strip().splitlines()[0][:300] if el.get("message") else ""
                said = [x.split("UserError:", 1)[1].strip() for x in (el.text or "").splitlines()
                        if x.startswith("E") and "rlgrad.errors.UserError:" in x]
                if tag != "skipped" and said:
                    documented = any(said[-1].startswith(r) for r in DOCUMENTED_REFUSALS)
                    message = ("rlgrad refusal: " if documented else "rlgrad error: ") + said[-1][:300]
                break
        cases[nodeid] = {"outcome": outcome, "message": message}
    deselected = [x for x in (d / "deselected.txt").read_text().splitlines() if x] if (
        d / "deselected.txt").is_file() else []
    counts = {k: sum(c["outcome"] == k for c in cases.values()) for k in ("passed", "failed", "error", "skipped")}
    return {"counts": {**counts, "deselected": len(deselected)}, "seconds": round(seconds, 1), "cases": cases}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trl-src", help="a TRL source tree at the installed release, or a git directory of TRL")
    ap.add_argument("--rev", help="with a git directory: the commit whose tests to run (default vVERSION)")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "rlgrad-trl-conformance"))
    ap.add_argument("--only", choices=("trl", "rlgrad"), help="one run only")
    ap.add_argument("--timeout", type=int, default=7200, help="seconds per run")
    ap.add_argument("-k", dest="k", help="pytest -k expression: a subset (say which in the record)")
    a = ap.parse_args(argv)
    version = importlib.metadata.version("trl")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    if not a.trl_src:
        where = "carries tests/" if sdist_has_tests(version, work) else "has no tests/"
        fail(f"TRL {version}'s sdist {where}; pass --trl-src, a TRL source tree at v{version} (git clone --branch "
             f"v{version} of TRL's repository) or a git directory of TRL")
    src = Path(a.trl_src).expanduser()
    if not src.exists():
        fail(f"--trl-src '{src}' does not exist")
    hub = work / "hub"
    build_hub(hub)
    origin = None
    runs = [x for x in ("trl", "rlgrad") if a.only in (None, x)]
    for name in runs:
        d = work / name
        shutil.rmtree(d, ignore_errors=True)
        origin = copy_tests(src, a.rev, version, d)
        rewrite(d / "tests" / "test_grpo_trainer.py", hub, subclass=name == "rlgrad")
        origin["shimmed"] = adapt_utils(d / "tests" / "testing_utils.py")
        (d / "conformance_plugin.py").write_text(PLUGIN)
    extra = ["-k", a.k] if a.k else []
    results = {name: run_suite(work, name, extra, a.timeout) for name in runs}
    summary = {"trl_version": version, "tests": origin, "subset": a.k,
               "command": " ".join([Path(sys.executable).name, "scripts/checks/trl_conformance.py",
                                    *(argv or sys.argv[1:])]),
               **{n: {"counts": r["counts"], "seconds": r["seconds"]} for n, r in results.items()}}
    status = 0
    if len(results) == 2:
        trl, ours = results["trl"]["cases"], results["rlgrad"]["cases"]
        lost = {t: ours.get(t, {"outcome": "missing", "message": ""}) for t, c in trl.items()
                if c["outcome"] == "passed" and ours.get(t, {}).get("outcome") != "passed"}
        refusals = {t: c["message"] for t, c in lost.items() if c["message"].startswith("rlgrad refusal")}
        other = {t: f"{c['outcome']}: {c['message']}" for t, c in lost.items() if t not in refusals}
        gained = [t for t, c in ours.items() if c["outcome"] == "passed" and trl.get(t, {}).get("outcome") != "passed"]
        summary.update(refusals=refusals, regressions=other, passed_only_with_rlgrad=gained)
        status = 1 if other else 0
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    for n in runs:
        c, s = results[n]["counts"], results[n]["seconds"]
        print(f"{n:7s} passed {c['passed']}, failed {c['failed']}, errors {c['error']}, skipped {c['skipped']}, "
              f"deselected {c['deselected']} ({s:.0f} s)")
    for t, m in summary.get("refusals", {}).items():
        print(f"refused  {t}: {m}")
    for t, m in summary.get("regressions", {}).items():
        print(f"REGRESSION {t}: {m}")
    print(f"summary: {work / 'summary.json'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
