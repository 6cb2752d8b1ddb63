"""Bad input: one line naming the culprit, exit status 2, nothing written. The CLI runs in process (``main``,
what ``python -m rlgrad`` calls: an exception other than the one-line error fails the test); one test goes
through the real entry point in a process of its own."""

import pytest

from rlgrad.cli import main
from tests.conftest import REPO, run_cli


def run_in_process(argv: list[str], cwd, capsys, monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args,culprit", [
    (["trainer.total_training_step=5"], "trainer.total_training_steps"),
    (["rollout.n=abc"], "rollout.n"),
    (["notakeyvalue"], "notakeyvalue"),
    (["model.path=/nonexistent/model"], "/nonexistent/model"),
    (["data.task=math", "data.train_files=[/nonexistent/train.jsonl]"], "/nonexistent/train.jsonl"),
    (["data.task=math"], "data.train_files"),
    (["trainer.resume_mode=resume_path", "trainer.resume_from_path=/nonexistent/global_step_3"],
     "/nonexistent/global_step_3"),
    (["--config", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["--config-name", "nosuchpreset"], "nosuchpreset"),
    (["actor_rollout_ref.rollout.gpu_memory_utilization=0.3"], "gpu_memory_utilization"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, culprit, capsys, monkeypatch):
    run = tmp_path / "run"
    if args[0].startswith("--"):
        cmd = ["train", *args, f"trainer.default_local_dir={run}"]
    else:
        cmd = ["train", f"trainer.default_local_dir={run}", f"model.cache_dir={tmp_path / 'cache'}", *args]
    code, err = run_in_process(cmd, tmp_path, capsys, monkeypatch)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlgrad: error:"), err
    assert culprit in lines[0]
    assert not run.exists()


def test_malformed_data_file_names_line(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\n{not json\n')
    code, err = run_in_process(["train", "data.task=math", f"data.train_files=[{bad}]",
                                f"trainer.default_local_dir={tmp_path / 'run'}"], tmp_path, capsys, monkeypatch)
    assert code == 2 and f"{bad}:2" in err, err
    assert len(err.strip().splitlines()) == 1


def test_bad_model_dir_without_config(tmp_path, capsys, monkeypatch):
    d = tmp_path / "notamodel"
    d.mkdir()
    code, err = run_in_process(["train", f"model.path={d}", f"trainer.default_local_dir={tmp_path / 'run'}"],
                               tmp_path, capsys, monkeypatch)
    assert code == 2 and "config.json" in err and len(err.strip().splitlines()) == 1, err


def test_unknown_flag_is_one_line(tmp_path):
    res = run_cli(["train", "--bogus"], cwd=tmp_path)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "--bogus" in res.stderr


def test_the_console_tells_each_step_and_what_an_analysis_found(tmp_path):
    import io

    from rlgrad.logging.sinks import ConsoleSink

    (tmp_path / "analysis" / "step_1").mkdir(parents=True)
    out = io.StringIO()  # not a terminal: plain lines, one a step (no carriage returns for a log file)
    sink = ConsoleSink(total=3, run_dir=tmp_path, stream=out)
    analysed = {"timing_s/step": 4.0, "timing_s/gen": 1.5, "timing_s/analysis/buckets": 2.25,
                "timing_s/update_actor": 0.25, "rollout/accuracy": 0.5, "rollout/score/mean": 0.45,
                "grad_norm/bucket_1/group_rv_count": 3.0, "grad_norm/bucket_1/reward_std_max": 0.0,
                "grad_norm/bucket_1/task": 0.0, "grad_norm/bucket_2/group_rv_count": 1.0,
                "grad_norm/bucket_2/reward_std_max": 0.5, "grad_norm/bucket_2/reward_std_mean": 0.5,
                "grad_norm/bucket_2/task": 2.0, "grad_norm/all/group_rv_count": 4.0,
                "grad_norm/all/group_rv_zero_count": 3.0, "grad_comp/correctness/share": 0.8,
                "grad_comp/format/share": 0.2,
                "grad_sim/correctness__format": -0.25, "actor/neuron/dormant_ratio": 0.031}
    sink.log(1, analysed)
    sink.log(2, {"timing_s/step": 1.0, "timing_s/gen": 0.5, "rollout/accuracy": 0.75, "rollout/score/mean": 0.7})
    sink.close()
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == [
        "step 1/3  acc 0.500  reward 0.450  (4.0 s)",
        "step 1 analysis: 3 of 4 groups (75%) have zero reward variance; largest task gradient: bucket_2 (reward std "
        "0.50); largest reward component: correctness (80% of the gradient); correctness vs format pull apart "
        f"(cosine -0.25); 3.1% of actor neurons dormant (files: {tmp_path / 'analysis' / 'step_1'})",
        "step 1: 4.00 s (gen 1.50, analysis/buckets 2.25, update_actor 0.25)",
        "step 2/3  acc 0.750  reward 0.700  (1.0 s)"]

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty = Terminal()
    sink = ConsoleSink(total=3, stream=tty)
    sink.log(1, {"rollout/accuracy": 0.5, "rollout/score/mean": 0.45})
    sink.close()
    assert "\r" in tty.getvalue() and "acc=0.500" in tty.getvalue() and "reward=0.450" in tty.getvalue()


def test_preset_help_shows_whole_descriptions_wrapped(capsys, monkeypatch):
    from rlgrad.cli import build_parser, first_sentence, main
    from rlgrad.config.load import preset_description, presets

    monkeypatch.setenv("COLUMNS", "80")
    assert first_sentence("DAPO (Yu et al. 2025) on x. Then (a. B) y. More") == "DAPO (Yu et al. 2025) on x."
    assert first_sentence("e.g. 9 - 8 = 1, once") == "e.g. 9 - 8 = 1, once"
    text = (REPO / "configs" / "demo.yaml").read_text()
    assert preset_description(text).startswith("The demo: GRPO on the embedded default (tiny Qwen2 + arithmetic) on "
                                               "CPU, a few minutes. The default model is warm-started")
    assert preset_description("# one\n# two\n#   rlgrad train x\n# three\n").endswith("one two")
    helptext = build_parser().subcommands["train"].format_help()
    assert "…" not in helptext and "characters]" not in helptext
    flat = " ".join(helptext.split())
    assert "demo The demo: GRPO on the embedded default (tiny Qwen2 + arithmetic) on CPU, a few minutes." in flat
    epilog = helptext[helptext.index("presets (--config-name"):]
    assert max(map(len, epilog.splitlines())) <= 80
    assert main(["presets"]) == 0
    listed = capsys.readouterr().out
    flat = " ".join(listed.split())
    for name, about in presets():
        assert f"{name} {about}" in flat  # whole, every word in order
    assert max(map(len, listed.splitlines())) <= 80


def test_next_commands_are_typed_as_they_work_in_the_shell(tmp_path, monkeypatch):
    """scripts/demo.sh runs .venv/bin/rlgrad without activating the venv: its "next:" lines must say
    .venv/bin/rlgrad; the same script found on PATH is plain `rlgrad`."""
    from rlgrad.cli import invoked_as

    script = tmp_path / ".venv" / "bin" / "rlgrad"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert invoked_as(".venv/bin/rlgrad") == ".venv/bin/rlgrad"
    assert invoked_as("/usr/lib/python3/site-packages/pytest") == "rlgrad"
    monkeypatch.setenv("PATH", str(script.parent))
    assert invoked_as(str(script)) == "rlgrad"
