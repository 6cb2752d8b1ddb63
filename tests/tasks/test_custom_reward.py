"""verl's custom_reward_function in rlgrad's trainer (rlgrad.tasks.custom_reward): the call verl makes, each
return type, each error, the dict's fields as reward components and their gradient geometry, a crash inside the
function; and the set-up stamp and preset help of the same issue."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from rlgrad.config.load import load_config
from rlgrad.errors import UserError
from rlgrad.tasks import Example, build_task
from tests.conftest import REPO, tiny_overrides

DATA = REPO / "tests" / "data"


def reward_file(tmp_path: Path, body: str, name: str = "reward.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


RECORDING = """
    CALLS = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
        CALLS.append(dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                          extra_info=extra_info, **kw))
        return {"score": 0.25, "acc": 1.0}
"""


def recorded(task) -> list[dict]:
    return task.function.fn.__globals__["CALLS"]


def verl_parquet(tmp_path: Path) -> str:
    """Two verl rows: an extra_info column, a ground truth that is a number, not a string."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": f"src{i}", "prompt": [{"role": "user", "content": f"What is {i} plus 1?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": i + 1},
             "extra_info": {"split": "train", "index": i}} for i in range(6)]
    path = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# ---- what the function is called with ------------------------------------------------------------

def test_verl_parquet_columns_reach_the_function_as_verl_passes_them(tmp_path):
    """verl 0.9's reward loop (experimental/reward_loop/reward_manager/naive.py), run on this layout, calls
    compute_score(data_source=<column>, solution_str=<response>, ground_truth=<reward_model.ground_truth as
    stored>, extra_info=<column> + {num_turns: 2, rollout_reward_scores: {}})."""
    path = reward_file(tmp_path, RECORDING)
    task = build_task("math", train_files=[verl_parquet(tmp_path)], val_size=1,
                      custom_reward={"path": path, "reward_kwargs": {"scale": 3}})
    probe = recorded(task)[0]  # before training: the reference answer of the first validation row (row 5)
    assert probe["solution_str"] == task.sft_target(task.val_examples()[0]) and probe["ground_truth"] == 6
    row = next(e for e in task.task._train if e.prompt == "What is 2 plus 1?")
    task.score("the answer is 3", row)
    assert recorded(task)[-1] == {"data_source": "src2", "solution_str": "the answer is 3", "ground_truth": 3,
                                  "extra_info": {"split": "train", "index": 2, "num_turns": 2,
                                                 "rollout_reward_scores": {}},
                                  "scale": 3}
    recorded(task)[-1]["extra_info"]["index"] = 99  # each call gets its own copy
    task.score("again", row)
    assert recorded(task)[-1]["extra_info"]["index"] == 2


def test_other_layouts_and_generated_tasks_pass_what_a_verl_file_of_them_would_hold(tmp_path):
    path = reward_file(tmp_path, RECORDING)
    gsm = build_task("math", train_files=[str(DATA / "math_train.jsonl")], custom_reward={"path": path})
    ex = next(e for e in gsm.task._train if e.meta["layout"] == "gsm8k")
    gsm.score("x", ex)
    assert recorded(gsm)[-1] == {"data_source": "math", "solution_str": "x", "ground_truth": "1007",
                                 "extra_info": {"num_turns": 2, "rollout_reward_scores": {}}}
    countdown = build_task("countdown", val_size=2, custom_reward={"path": path})
    ex = countdown.val_examples()[1]
    countdown.score("1+2", ex)
    call = recorded(countdown)[-1]  # TinyZero's countdown rows: {"target", "numbers"}
    assert call["data_source"] == "countdown"
    assert call["ground_truth"] == {"target": ex.meta["target"], "numbers": ex.meta["numbers"]}
    arithmetic = build_task("arithmetic", val_size=2, custom_reward={"path": path})
    ex = arithmetic.val_examples()[0]
    arithmetic.score("5", ex)
    assert recorded(arithmetic)[-1] == {"data_source": "arithmetic", "solution_str": "5", "ground_truth": ex.answer,
                                        "extra_info": {"difficulty": ex.meta["difficulty"], "num_turns": 2,
                                                       "rollout_reward_scores": {}}}


def test_reasoning_gym_passes_the_entry_its_verifier_scores_with(tmp_path):
    pytest.importorskip("reasoning_gym")
    path = reward_file(tmp_path, RECORDING)
    task = build_task("reasoning_gym", reasoning_gym={"dataset": "chain_sum"}, val_size=2,
                      custom_reward={"path": path})
    ex = task.val_examples()[0]
    task.score("7", ex)
    call = recorded(task)[-1]
    assert call["data_source"] == "chain_sum" and call["ground_truth"] == ex.meta["entry"]["answer"]
    assert call["extra_info"]["entry"] == ex.meta["entry"] and call["extra_info"]["split"] == "val"


# ---- each return type ----------------------------------------------------------------------------

def test_a_number_is_the_reward_and_correct_is_the_tasks_verdict(tmp_path):
    path = reward_file(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info):
            return len(solution_str) / 10
    """)
    task = build_task("arithmetic", val_size=2, custom_reward={"path": path})
    assert task.weights == {"rest": 1.0}
    ex = Example(prompt="2+3=", answer="5", meta={"difficulty": 1})
    s = task.score("5", ex)
    assert (s.total, s.components, s.correct, s.actual_length) == (0.1, {"rest": 0.1}, True, 1)
    s = task.score("12345", ex)
    assert (s.total, s.components, s.correct) == (0.5, {"rest": 0.5}, False)


@pytest.mark.parametrize("value,expected", [(True, 1.0), (3, 3.0), ("numpy", 0.75), ("torch", -2.0)])
def test_numbers_of_any_kind_are_read(tmp_path, value, expected):
    literal = {"numpy": "numpy.float32(0.75)", "torch": "torch.tensor(-2.0)"}.get(value, repr(value))
    path = reward_file(tmp_path, f"""
        import numpy, torch

        def compute_score(data_source, solution_str, ground_truth, extra_info):
            return {{"score": {literal}, "f": {literal}}}
    """)
    task = build_task("arithmetic", val_size=1, custom_reward={"path": path}, weights={"f": 1.0})
    s = task.score("1", task.val_examples()[0])
    assert s.total == expected and s.components == {"f": expected, "rest": 0.0}


DICT_REWARD = """
    def compute_score(data_source, solution_str, ground_truth, extra_info):
        acc = solution_str.strip() == ground_truth
        short = 1.0 - len(solution_str) / 8
        return {"score": acc + 0.5 * short, "acc": acc, "short": short, "pred": solution_str, "none": None}
"""


def test_a_dict_score_is_the_reward_and_its_numeric_fields_are_components(tmp_path):
    path = reward_file(tmp_path, DICT_REWARD)
    plain = build_task("arithmetic", val_size=2, custom_reward={"path": path})
    assert plain.weights == {"acc": 0.0, "short": 0.0, "rest": 1.0}  # pred and none are no numbers
    ex = Example(prompt="2+3=", answer="5", meta={"difficulty": 1})
    s = plain.score("5", ex)  # acc 1, short 7/8: score 1 + 7/16
    assert s.total == 1.4375 and s.components == {"acc": 1.0, "short": 0.875, "rest": 1.4375} and s.correct
    s = plain.score("4", ex)  # acc (verl's name) decides correct, not the task
    assert s.total == 0.4375 and not s.correct
    weighted = build_task("arithmetic", val_size=2, custom_reward={"path": path}, weights={"acc": 1, "short": 0.5})
    assert weighted.weights == {"acc": 1.0, "short": 0.5, "rest": 1.0}
    s = weighted.score("5", ex)  # the weights rebuild the score: rest is 0
    assert s.total == 1.4375 and s.components == {"acc": 1.0, "short": 0.875, "rest": 0.0}
    half = build_task("arithmetic", val_size=2, custom_reward={"path": path}, weights={"short": 0.25})
    s = half.score("55", ex)  # acc 0, short 0.75: score 0.375, the weighted part 0.1875, rest 0.1875
    assert s.total == 0.375 and s.components == {"acc": 0.0, "short": 0.75, "rest": 0.1875}
    assert sum(half.weights[c] * v for c, v in s.components.items()) == s.total


def test_field_names_become_metric_keys_apart_from_rlgrads_own(tmp_path):
    path = reward_file(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info):
            return {"score": 1, "rest": 2, "format-ok": 3, "overlong": 4}
    """)
    task = build_task("arithmetic", val_size=1, custom_reward={"path": path}, weights={"rest_2": 0.5})
    assert task.weights == {"rest_2": 0.5, "format_ok": 0.0, "overlong_2": 0.0, "rest": 1.0}
    assert task.score("1", task.val_examples()[0]).components == {"rest_2": 2.0, "format_ok": 3.0,
                                                                   "overlong_2": 4.0, "rest": 0.0}


def test_an_async_function_and_pkg_paths_work_as_in_verl(tmp_path, monkeypatch):
    reward_file(tmp_path, """
        async def score(data_source, solution_str, ground_truth, extra_info):
            return 0.5
    """, name="my_rewards.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = build_task("arithmetic", val_size=1, custom_reward={"path": "pkg://my_rewards", "name": "score"})
    assert task.score("1", task.val_examples()[0]).total == 0.5
    task = build_task("arithmetic", val_size=1,
                      custom_reward={"path": f"file://{tmp_path / 'my_rewards.py'}", "name": "score"})
    assert task.score("1", task.val_examples()[0]).total == 0.5


# ---- errors: one line, naming the file and the function ------------------------------------------

def one_line(path_or_body, tmp_path, task="arithmetic", **custom) -> str:
    path = path_or_body if "\n" not in path_or_body else reward_file(tmp_path, path_or_body)
    with pytest.raises(UserError) as e:
        build_task(task, val_size=2, custom_reward={"path": path, **custom})
    msg = str(e.value)
    assert "\n" not in msg and path in msg and custom.get("name", "compute_score") in msg, msg
    return msg


def test_a_missing_file_directory_or_non_python_file_is_one_line(tmp_path):
    assert "does not exist" in one_line(str(tmp_path / "nope.py"), tmp_path)
    assert "is a directory" in one_line(str(tmp_path), tmp_path)
    (tmp_path / "r.txt").write_text("x = 1\n")
    assert "not a Python file" in one_line(str(tmp_path / "r.txt"), tmp_path)
    (tmp_path / "bad.py").write_text("def compute_score(:\n")
    assert "bad.py:1" in one_line(str(tmp_path / "bad.py"), tmp_path)


def test_the_cli_says_it_in_one_line_and_exits_2_writing_nothing(tmp_path, capsys):
    from rlgrad.cli import main

    missing = tmp_path / "nope.py"
    run = tmp_path / "run"
    assert main(["train", f"custom_reward_function.path={missing}", f"trainer.default_local_dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0] and "compute_score" in err[0]
    assert not run.exists()


def test_a_missing_function_is_one_line_with_a_hint(tmp_path):
    body = """
        def compute_scores(data_source, solution_str, ground_truth, extra_info):
            return 1.0

        THRESHOLD = 3
    """
    msg = one_line(body, tmp_path)
    assert "no function 'compute_score'" in msg and "did you mean 'compute_scores'" in msg
    msg = one_line(reward_file(tmp_path, body), tmp_path, name="THRESHOLD")
    assert "'THRESHOLD'" in msg and "is a int, not a function" in msg


def test_a_wrong_signature_is_one_line(tmp_path):
    msg = one_line("""
        def compute_score(solution_str, ground_truth):
            return 1.0
    """, tmp_path)
    assert "compute_score" in msg and "data_source" in msg and "(solution_str, ground_truth)" in msg
    msg = one_line(reward_file(tmp_path, RECORDING.replace(", **kw", "")), tmp_path, reward_kwargs={"scale": 2})
    assert "scale" in msg


@pytest.mark.parametrize("ret,says", [
    ("'high'", "returned 'high' (str)"), ("[1.0]", "returned [1.0] (list)"), ("None", "returned None (NoneType)"),
    ("{'acc': 1}", "without 'score'"), ("{'score': 'x'}", "non-numeric 'score'"), ("float('nan')", "score=nan"),
    ("{'score': 1, 'f': float('inf')}", "f=inf"),
])
def test_a_non_numeric_return_is_one_line_naming_the_row(tmp_path, ret, says):
    path = reward_file(tmp_path, f"""
        def compute_score(data_source, solution_str, ground_truth, extra_info):
            return {ret}
    """)
    with pytest.raises(UserError) as e:  # the probe before training finds it, naming the row it scored
        build_task("math", train_files=[str(DATA / "math_verl.parquet")], custom_reward={"path": path})
    msg = str(e.value)
    assert "\n" not in msg and f"reward function compute_score ({path})" in msg and says in msg, msg
    assert "math_verl.parquet: row 7" in msg


def test_fields_that_change_between_returns_are_one_line(tmp_path):
    path = reward_file(tmp_path, """
        def compute_score(data_source, solution_str, ground_truth, extra_info):
            return {"score": 1.0, "a": 1.0} if "First" in solution_str else {"score": 0.0, "b": 0.0}
    """)
    task = build_task("math", train_files=[str(DATA / "math_verl.parquet")], custom_reward={"path": path})
    with pytest.raises(UserError) as e:
        task.score("7", task.task._train[0])
    msg = str(e.value)
    assert "\n" not in msg and "fields b for row tests" not in msg
    assert "returned the numeric fields b for row" in msg and "but a for the reference answer of row" in msg


def test_weights_name_the_functions_fields(tmp_path):
    path = reward_file(tmp_path, DICT_REWARD)
    for weights, says in [({"correctness": 1}, "its dict's numeric fields are acc, short"),
                          ({"rest": 2}, "its weight is 1"), ({"acc": "high"}, "must be a number")]:
        with pytest.raises(UserError, match=says):
            build_task("arithmetic", val_size=1, custom_reward={"path": path}, weights=weights)
    number = reward_file(tmp_path, "def compute_score(**kw):\n    return 1.0\n", name="number.py")
    with pytest.raises(UserError, match="no numeric field besides score"):
        build_task("arithmetic", val_size=1, custom_reward={"path": number}, weights={"acc": 1})


def test_settings_verl_spellings_and_tasks_without_ground_truth():
    cfg = load_config(overrides=["custom_reward_function.path=r.py", "custom_reward_function.reward_kwargs.k=2"])
    fn = cfg.reward.custom_reward_function
    assert (fn.path, fn.name, fn.reward_kwargs) == ("r.py", "compute_score", {"k": 2})
    assert load_config(overrides=["reward.custom_reward_function.name=score"]).reward.custom_reward_function.name \
        == "score"
    with pytest.raises(UserError, match="rewarded by its environment") as e:
        load_config(overrides=["data.task=sokoban", "custom_reward_function.path=r.py"])
    assert "'custom_reward_function.path' (reward.custom_reward_function.path)" in str(e.value)
    with pytest.raises(UserError, match="must name the function"):
        load_config(overrides=["reward.custom_reward_function.path=r.py", "reward.custom_reward_function.name=''"])


# ---- in the trainer: components, geometry, a crash -----------------------------------------------

PARTS = """
    def compute_score(data_source, solution_str, ground_truth, extra_info):
        digits = sum(c.isdigit() for c in solution_str) / 4
        spaces = solution_str.count(" ") / 4
        return {"score": digits + 0.5 * spaces, "digits": digits, "spaces": spaces, "text": solution_str}
"""


def parts(response: str) -> dict[str, float]:  # PARTS by hand
    return {"digits": sum(c.isdigit() for c in response) / 4, "spaces": response.count(" ") / 4}


def train(tmp_path: Path, model_cache: Path, path: str, *extra: str, run: str = "run", steps: int = 1) -> Path:
    from rlgrad.recipes import make_trainer

    overrides = [*tiny_overrides(model_cache, tmp_path / run), "data.task=math",
                 f"data.train_files=[{DATA / 'math_verl.parquet'}]", f"custom_reward_function.path={path}",
                 "analysis.components.every=1", f"trainer.total_training_steps={steps}",
                 "trainer.val_before_train=false", "rollout.response_length=6", *extra]
    make_trainer(load_config(overrides=overrides), log=lambda *a: None).fit()
    return tmp_path / run


def test_the_dicts_fields_are_logged_and_split_the_update(tmp_path, model_cache):
    path = reward_file(tmp_path, PARTS)
    run = train(tmp_path, model_cache, path, "reward.weights={digits: 1.0, spaces: 0.5}")
    rollouts = [json.loads(line) for line in (run / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    record = json.loads((run / "reward_components.jsonl").read_text().splitlines()[-1])
    assert record["components"] == ["digits", "spaces", "rest"]
    assert record["weights"] == {"digits": 1.0, "spaces": 0.5, "rest": 1.0}
    for r, sample in zip(rollouts, record["samples"]):  # the logged values are the function's, by hand
        want = parts(r["response"])
        assert sample["components"] == pytest.approx({**want, "rest": 0.0})
        assert sample["total"] == pytest.approx(want["digits"] + 0.5 * want["spaces"])
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["data"]
    mean = sum(parts(r["response"])["digits"] for r in rollouts) / len(rollouts)
    assert metrics["reward/digits/mean"] == pytest.approx(mean)
    doc = json.loads((run / "analysis" / "step_1" / "components.json").read_text())
    assert doc["components"] == ["digits", "spaces", "rest"]
    share = doc["global"]["share"]
    assert doc["global"]["norm"]["rest"] == 0.0 and share["rest"] == 0.0  # the weights rebuild the score
    assert doc["global"]["norm"]["digits"] > 0 and share["digits"] + share["spaces"] == pytest.approx(1, abs=1e-5)
    assert metrics["grad_comp/digits/share"] == pytest.approx(share["digits"])


def test_unweighted_fields_are_in_the_geometry_with_no_gradient(tmp_path, model_cache):
    path = reward_file(tmp_path, PARTS)
    run = train(tmp_path, model_cache, path)
    doc = json.loads((run / "analysis" / "step_1" / "components.json").read_text())
    assert doc["components"] == ["digits", "spaces", "rest"]
    assert doc["global"]["norm"]["digits"] == doc["global"]["norm"]["spaces"] == 0.0
    assert doc["global"]["share"]["rest"] == pytest.approx(1.0)  # the whole score is the rest
    record = json.loads((run / "reward_components.jsonl").read_text().splitlines()[-1])
    assert all(s["components"]["rest"] == pytest.approx(s["total"]) for s in record["samples"])


CRASHING = """
    import os

    CALLS = [0]

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        CALLS[0] += 1
        if CALLS[0] > int(os.environ.get("CRASH_AFTER", "1000000")):
            return ratio(solution_str)
        return 1.0

    def ratio(text):
        return len(text) / 0
"""


def test_an_exception_in_the_function_stops_the_run_with_its_traceback_and_row(tmp_path, model_cache, monkeypatch,
                                                                               capsys):
    from rlgrad.cli import main

    path = reward_file(tmp_path, CRASHING)
    args = ["train", *tiny_overrides(model_cache, tmp_path / "run"), "data.task=math",
            f"data.train_files=[{DATA / 'math_verl.parquet'}]", f"custom_reward_function.path={path}",
            "trainer.val_before_train=false", "trainer.total_training_steps=3", "trainer.save_freq=1"]
    monkeypatch.setenv("CRASH_AFTER", "1")  # the first step's first response: the run leaves nothing
    assert main(args) == 2
    err = capsys.readouterr().err
    first, *trace = err.strip().splitlines()
    assert first.startswith(f"rlgrad: error: reward function compute_score ({path}) raised ZeroDivisionError for "
                            "row ") and "math_verl.parquet: row" in first
    assert trace[0] == "Traceback (most recent call last):" and trace[-1] == "ZeroDivisionError: division by zero"
    files = [line for line in trace if line.lstrip().startswith("File ")]
    assert len(files) == 2 and all(path in f for f in files) and "in ratio" in files[-1]  # only their frames
    assert not (tmp_path / "run").exists()
    # at step 2 (16 responses a step, one call before training): step 1's files are whole, the resume goes on
    monkeypatch.setenv("CRASH_AFTER", "20")
    assert main(args) == 2 and "ZeroDivisionError" in capsys.readouterr().err
    run = tmp_path / "run"
    assert (run / "global_step_1").is_dir() and not (run / "global_step_2").exists()
    for name in ("metrics.jsonl", "reward_components.jsonl"):
        rows = [json.loads(line) for line in (run / name).read_text().splitlines()]  # whole lines only
        assert [r["step"] for r in rows] == [1]
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == ["step_1.jsonl"]
    monkeypatch.delenv("CRASH_AFTER")
    assert main(args) == 0
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


# ---- the shipped example: data, preset ------------------------------------------------------------

def test_the_shipped_example_data_is_what_its_script_builds():
    import importlib.util

    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("build_example_data",
                                                  REPO / "scripts" / "generate" / "build_example_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert pq.read_table(REPO / "examples" / "data" / "tiny_arith.parquet").to_pylist() == module.rows()


def test_the_preset_scores_with_the_example_function(monkeypatch):
    """The preset: the demo's arithmetic (bare integers) through the example function, weights as it builds its
    score (rest 0)."""
    monkeypatch.chdir(REPO)  # the preset's paths are relative to the repository root
    from rlgrad.tasks import task_from_config

    task = task_from_config(load_config("custom_reward_demo"))
    assert task.name == "arithmetic"
    assert task.weights == {"acc": 1.0, "format": 0.2, "brevity": 0.2, "rest": 1.0}
    ex = next(e for e in task.val_examples() if e.answer.startswith("-"))  # the demo's fix: the minus sign
    s = task.score(ex.answer, ex)  # acc 1, format 1, brevity 1 - len/100
    brevity = 1 - len(ex.answer) / 100
    assert s.total == pytest.approx(1.2 + 0.2 * brevity) and s.components == pytest.approx(
        {"acc": 1.0, "format": 1.0, "brevity": brevity, "rest": 0.0}) and s.correct
    dropped = task.score(ex.answer[1:], ex)  # the sloppy teacher's answer: readable, wrong, one character shorter
    assert dropped.components == pytest.approx({"acc": 0.0, "format": 1.0, "brevity": brevity + 0.01, "rest": 0.0})
    assert not dropped.correct


def test_the_example_function_reads_a_verl_parquet_and_no_empty_box(monkeypatch):
    """The same function on the sample verl parquet (data.task=math): the last non-empty box is the answer; an
    empty \\boxed{} is none (it would earn format and brevity for nothing)."""
    monkeypatch.chdir(REPO)
    from rlgrad.tasks import task_from_config

    task = task_from_config(load_config("custom_reward_demo", overrides=[
        "data.task=math", "data.train_files=[examples/data/tiny_arith.parquet]", "data.val_size=24"]))
    ex = task.val_examples()[0]
    assert ex.prompt == "What is 3 minus 2?" and len(task.val_examples()) == 24
    s = task.score("So \\boxed{1}", ex)  # acc 1, format 1, brevity 1 - 12/100: 1 + 0.2 + 0.176
    assert s.total == pytest.approx(1.376) and s.components == pytest.approx(
        {"acc": 1.0, "format": 1.0, "brevity": 0.88, "rest": 0.0}) and s.correct
    empty = task.score("\\boxed{1} so \\boxed{}", ex)  # the empty box is passed over: the answer is 1
    assert empty.components["acc"] == 1.0
    none = task.score("\\boxed{ }", ex)
    assert none.components == pytest.approx({"acc": 0.0, "format": 0.0, "brevity": 0.91, "rest": 0.0})
