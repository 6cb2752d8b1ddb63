"""Hostile input, generated: a bad value for every field of the schema, and bad inputs for every subcommand.

Each must end in exit status 2 with one line naming the culprit, no traceback, and nothing created or
changed on disk. The CLI is called in this process (``rlgrad.cli.main``) to keep it fast.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path

import pytest

from rlgrad import cli
from rlgrad.config.load import load_config
from rlgrad.config.schema import RLGradConfig, _walk
from rlgrad.errors import UserError

# Free-form settings: any value of their type is meaningful (names, paths checked when opened, mappings of
# user data, switches); bad files and paths are fuzzed through the subcommands below.
FREE = {"model.path", "model.cache_dir", "data.train_files", "data.val_files", "data.system_prompt",
        "data.reasoning_gym.dataset", "data.reasoning_gym.config", "trainer.project_name",
        "trainer.experiment_name", "trainer.default_local_dir", "trainer.resume_from_path",
        "trainer.rollout_data_dir", "critic.model.path"}


def bad_values(key: str, f: dataclasses.Field) -> list[str]:
    """Override values the field must refuse."""
    hints = typing.get_type_hints(_owner(key))
    tp = hints[f.name]
    args = typing.get_args(tp)
    base = next((a for a in args if a is not type(None)), tp) if args and type(None) in args else tp
    meta = f.metadata
    if meta.get("choices"):
        return ["no_such_choice", "[1, 2]"]
    if base is bool:
        return ["maybe", "[true]"]
    if base in (int, float):
        out = ["abc", "[1]", "{a: 1}"] + ([".nan", ".inf", "-.inf", "nan"] if base is float else ["1.5", "1e400"])
        for op, b in meta.get("bounds", {}).items():
            v = {"ge": b - 1, "gt": b, "le": b + 1, "lt": b}[op]
            if v not in meta.get("also", ()):
                out.append(repr(int(v)) if base is int else repr(float(v)))
        return out
    if typing.get_origin(base) is list:
        inner = typing.get_args(base)[0]
        return ["5"] + (["[.nan, 0.9]", "[0.9]", "[1.5, 0.9]", "[]"] if inner is float else [])
    if typing.get_origin(base) is dict:
        return ["5", "{correctness: .nan}"]
    if base is str:
        return ["[1, 2]"]
    if key == "actor.lora.target_modules":  # a word or a list of module names
        return ["5", "[1, 2]", "[]", "''"]
    raise AssertionError(f"no bad values for {key} of type {tp}")


def _owner(key: str) -> type:
    node = RLGradConfig
    for part in key.split(".")[:-1]:
        node = typing.get_type_hints(node)[part]
    return node


CASES = [(k, v) for k, f, _ in _walk(RLGradConfig()) if k not in FREE for v in bad_values(k, f)]


def test_every_field_is_fuzzed_or_declared_free():
    keys = {k for k, _, _ in _walk(RLGradConfig())}
    fuzzed = {k for k, _ in CASES}
    assert keys == fuzzed | FREE and not fuzzed & FREE
    assert len(CASES) > 300


@pytest.mark.parametrize("key,value", CASES, ids=[f"{k}={v}" for k, v in CASES])
def test_bad_value_is_refused_naming_the_key(key, value):
    with pytest.raises(UserError) as e:
        cfg = load_config(None, None, [f"{key}={value}"])
        pytest.fail(f"{key}={value} accepted: {getattr(cfg, key.split('.')[0])}")
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg


def test_refusals_say_what_is_allowed_and_why():
    cases = {"rollout.temperature=0": "greedy", "actor.max_grad_norm=-1": "reverses the update",
             "trainer.max_ckpt_to_keep=0": "-1 or null keeps every checkpoint", "actor.clip_ratio_c=1":
             "must be > 1", "trainer.save_freq=0": ">= 1 or -1", "actor.optim.lr=nan": "finite",
             "trainer.seed=99999999999": "<= 4.29497e+09", "model.tiny.num_key_value_heads=3": "divide"}
    for override, text in cases.items():
        with pytest.raises(UserError, match=None) as e:
            load_config(None, None, [override])
        assert text in str(e.value), (override, str(e.value))
    for ok in ("trainer.max_ckpt_to_keep=-1", "trainer.save_freq=-1", "actor.entropy_coeff=-0.5"):
        load_config(None, None, [ok])


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    rc = cli.main(argv)
    err = capsys.readouterr().err
    return rc, err


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("key,value", CASES[::7])  # every 7th case end to end: nothing created
def test_bad_value_through_the_cli_creates_nothing(key, value, tmp_path, capsys):
    before = snapshot(tmp_path)
    rc, err = run_main(["train", f"{key}={value}", f"trainer.default_local_dir={tmp_path / 'run'}"], capsys)
    assert rc == 2 and err.startswith("rlgrad: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err and snapshot(tmp_path) == before


def bad_files(tmp: Path) -> dict[str, Path]:
    tmp.mkdir()
    (tmp / "empty").write_text("")
    (tmp / "binary").write_bytes(b"\xff\xfe\x00garbage\x81\n")
    (tmp / "truncated.jsonl").write_text('{"step": 1, "data": {"a"')
    (tmp / "adir").mkdir()
    unreadable = tmp / "unreadable"
    unreadable.write_text('{"step": 1}\n')
    unreadable.chmod(0)
    return {"missing": tmp / "missing", "empty": tmp / "empty", "binary": tmp / "binary",
            "truncated": tmp / "truncated.jsonl", "directory": tmp / "adir", "unreadable": unreadable}


SUBCOMMANDS = {
    "config": lambda p: ["train", "--config", str(p)],
    "plot": lambda p: ["plot", str(p)],
    "report": lambda p: ["report", str(p)],
    "samples": lambda p: ["samples", str(p)],
    "export": lambda p: ["export", "rewards", str(p)],
    "doctor": lambda p: ["doctor", str(p)],
    "doctor-thresholds": lambda p: ["doctor", "{run}", "--thresholds", str(p)],
    "probe": lambda p: ["probe", "--resume-from-path", str(p)],
}


EMPTY_OK = {"config", "doctor-thresholds"}  # an empty YAML file: no settings, the defaults


@pytest.mark.parametrize("sub", sorted(SUBCOMMANDS))
def test_bad_input_files_for_every_subcommand(sub, tmp_path, capsys):
    files = bad_files(tmp_path / "in")
    run = tmp_path / "run"  # a valid run for the subcommands that take a second input
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "data": {"critic/score/mean": 0.5}}\n')
    for name, path in files.items():
        if name == "unreadable" and os.geteuid() == 0:
            continue  # root reads it anyway
        if name == "empty" and sub in EMPTY_OK:
            continue
        argv = [a.replace("{run}", str(run)) for a in SUBCOMMANDS[sub](path)]
        before = snapshot(tmp_path)
        rc, err = run_main(argv, capsys)
        capsys.readouterr()
        assert rc == 2, (sub, name, rc, err)
        assert err.startswith("rlgrad: error:") and err.count("\n") == 1 and "Traceback" not in err, (sub, name, err)
        assert snapshot(tmp_path) == before, (sub, name)


DAMAGE = {
    "metrics.jsonl": [b"\xff\xfe\x00\x81binary\n", b'{"step": 1, "data": {"grad_norm/all/task": 0.5}}\n{"st'],
    "config.yaml": [b"trainer: [unclosed\n", b"\xff\xfe\x00\x81\n"],
    "reward_components.jsonl": [b"\xff\xfe\x00\x81\n", b'{"step": 1, "components": 5}\n', b'{"step": 1}\n'],
    "analysis/step_1/group_rv_table.csv": [b"\xff\xfe\x00\x81\n", b"bucket,group_id\nx,notanint\n"],
    "analysis/step_1/components.json": [b"{", b'{"cosine": {"a__b": null}, "share": {"a": null}}'],
}
# --dpi 20: what is checked is how each command meets the damage, not the figures (plot's default 150 dpi took
# some 40% of this test's time)
RUN_COMMANDS = {"plot": lambda r, o: ["plot", str(r), "--output-dir", str(o), "--dpi", "20"],
                "report": lambda r, o: ["report", str(r), "--output", str(o / "r.html"), "--dpi", "20"],
                "export": lambda r, o: ["export", "rewards", str(r), "--output", str(o / "rw.json")],
                "samples": lambda r, o: ["samples", str(r)], "doctor": lambda r, o: ["doctor", str(r)]}


@pytest.mark.parametrize("damaged", sorted(DAMAGE))
def test_damaged_run_files(damaged, tmp_path, capsys):
    """A run directory with one damaged file: every command either reads around the damage (exit 0/1) or
    says which file in one line (exit 2); never a traceback; the run's own files are never changed."""
    for k, content in enumerate(DAMAGE[damaged]):
        run = tmp_path / f"run{k}"
        (run / "analysis" / "step_1").mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"step": 1, "data": {"grad_norm/all/task": 0.5, '
                                           '"grad_norm/bucket_1/task": 0.4, "critic/score/mean": 0.2}}\n')
        (run / "reward_components.jsonl").write_text('{"step": 1, "components": {"correctness": {"mean": 0.5}}}\n')
        (run / damaged).write_bytes(content)
        for name, argv in RUN_COMMANDS.items():
            out = tmp_path / f"out{k}_{name}"
            out.mkdir()
            before = snapshot(run)
            try:
                rc, err = run_main(argv(run, out), capsys)
            except Exception as e:  # noqa: BLE001 - the failure this test looks for
                pytest.fail(f"{name} on damaged {damaged} #{k}: {type(e).__name__}: {e}")
            assert rc in (0, 1, 2), (name, damaged, k, rc, err)
            if rc == 2:
                assert err.startswith("rlgrad: error:") and err.count("\n") == 1, (name, damaged, k, err)
            assert snapshot(run) == before, (name, damaged, k)


def test_a_metrics_file_of_binary_garbage_is_named_unreadable(tmp_path, capsys):
    """Issue 50: rlgrad plot on a run whose metrics.jsonl is random bytes said the run "holds no analysis steps"
    (report and doctor went on with no rows). A torn first row alone (a crash mid-append) is no damage."""
    import random

    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    out = tmp_path / "out"
    commands = [["plot", str(run), "--output-dir", str(out)], ["report", str(run), "--output", str(out / "r.html")],
                ["doctor", str(run)]]
    for garbage in (random.Random(50).randbytes(4096), b"not json\nnor this\n"):
        metrics.write_bytes(garbage)
        for argv in commands:
            rc, err = run_main(argv, capsys)
            assert (rc, err) == (2, f"rlgrad: error: '{metrics}' cannot be read: no line of it is a metric row "
                                    "(damaged, or not a metrics file)\n"), argv
    assert not out.exists()
    metrics.write_text('{"step": 1, "data": {"critic/sc')  # torn: the run has no row yet, nothing is damaged
    rc, err = run_main(commands[0], capsys)
    assert rc == 2 and "holds no analysis steps" in err, err


def test_outputs_never_overwrite_the_run_and_bad_output_paths_are_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "data": {"critic/score/mean": 0.5}}\n')
    (run / "reward_components.jsonl").write_text(
        '{"step": 1, "components": ["correctness"], "stats": {"correctness": {"mean": 0.5}}, "samples": [], '
        '"num_samples": 0, "mean_length": 0.0}\n')
    (tmp_path / "afile").write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    cases = [["report", str(run), "--output", str(run / "metrics.jsonl")],
             ["export", "rewards", str(run), "--output", str(run / "reward_components.jsonl")],
             ["report", str(run), "--output", str(tmp_path / "afile" / "r.html")],
             ["export", "rewards", str(run), "--output", str(tmp_path)]]
    if os.geteuid() != 0:  # root writes anywhere
        cases.append(["report", str(run), "--output", str(ro / "r.html")])
    for argv in cases:
        before = snapshot(tmp_path)
        rc, err = run_main(argv, capsys)
        assert rc == 2 and err.startswith("rlgrad: error:") and err.count("\n") == 1, (argv, err)
        assert snapshot(tmp_path) == before, argv


def test_damaged_model_directories_are_one_line(tmp_path):
    import json as _json

    from rlgrad.config.model import ModelConfig, TinyModelConfig
    from rlgrad.models import build_char_tokenizer, build_tiny_model, load_pretrained

    tok = build_char_tokenizer()
    tiny = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=64)
    model = build_tiny_model(ModelConfig(tiny=tiny), tok, 1)
    cases = {}
    for name in ("no_tokenizer", "truncated", "shape", "not_causal", "bad_config"):
        d = tmp_path / name
        model.save_pretrained(d)
        if name != "no_tokenizer":
            tok.save_pretrained(d)
        cases[name] = d
    w = cases["truncated"] / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    for name, change in (("shape", {"hidden_size": 64}), ("not_causal", {"architectures": ["BertModel"]})):
        c = _json.loads((cases[name] / "config.json").read_text())
        c.update(change)
        (cases[name] / "config.json").write_text(_json.dumps(c))
    (cases["bad_config"] / "config.json").write_text("[1, 2]")
    expect = {"no_tokenizer": "has no tokenizer", "truncated": "could not be loaded", "shape": "could not be loaded",
              "not_causal": "not a causal language model", "bad_config": "not a JSON object"}
    for name, d in cases.items():
        with pytest.raises(UserError, match=expect[name]) as e:
            load_pretrained(d)
        assert "\n" not in str(e.value) and str(d) in str(e.value), (name, str(e.value))


def test_bad_argument_values_for_every_subcommand(tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "data" / "doctor" / "healthy", run)
    r = str(run)
    cases = [["plot", r, "--dpi", "0"], ["plot", r, "--dpi", "-5"], ["plot", r, "--step", "99999"],
             ["plot", r, "--wandb-path", "a/b/c"], ["report", r, "--dpi", "0"], ["report", r, "--max-steps", "0"],
             ["report", r, "--dpi", "abc"], ["samples", r, "--step", "-1"], ["samples", r, "--max", "abc"],
             ["export", "rewards", r, "--format", "xml"], ["export", "nothing", r],
             ["doctor", r, "--thresholds", str(tmp_path / "missing.yaml")], ["doctor", r, "--wandb-path", "x"],
             ["probe"], ["train", "--config-name", "no_such_preset"], ["train", "not_an_override"],
             ["nosuchcommand"], ["plot", r, "--no-such-flag"], ["plot-steps", "--step-dir", "x", "--out", "o.png"]]
    for argv in cases:
        before = snapshot(tmp_path)
        try:
            rc, err = run_main(argv, capsys)
        except SystemExit as e:  # argparse's own exits go through rlgrad's parser: still exit 2, one line
            rc, err = e.code, capsys.readouterr().err
        assert rc == 2, (argv, rc, err)
        assert err.startswith("rlgrad: error:") and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
        assert snapshot(tmp_path) == before, argv


def test_written_files_follow_the_umask_and_errors_name_the_right_help(tmp_path, capsys):
    from rlgrad.runfiles import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")  # a report or figure must be readable by others to be shared
        assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.txt", "x")
        assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
    for argv, hint in ((["nosuchcommand"], "(see rlgrad --help)"), (["plot", "--nope"], "(see rlgrad plot --help)")):
        try:
            cli.main(argv)
        except SystemExit as e:
            assert e.code == 2
        err = capsys.readouterr().err
        assert err.rstrip().endswith(hint) and "rlgrad rlgrad" not in err, err
