"""data.task=reasoning_gym: prompts and verifiers from the reasoning-gym library."""

import json
import random
import sys

import pytest

from rlgrad.errors import UserError
from rlgrad.tasks import TASK_NAMES, Example, build_task
from tests.conftest import tiny_overrides

DATASETS = ["chain_sum", "basic_arithmetic", "countdown", "gsm_symbolic", "rotate_matrix"]


@pytest.fixture(scope="module")
def rg():
    return pytest.importorskip("reasoning_gym")


def task(dataset, config=None, **kw):
    return build_task("reasoning_gym", reasoning_gym={"dataset": dataset, "config": config or {}}, **kw)


def verifier(rg, dataset, answer, example: Example) -> float:
    """The dataset's own score for ``answer``, from an instance of its own (not the task's)."""
    value = rg.create_dataset(dataset, seed=1, size=1).score_answer(answer, example.meta["entry"])
    return min(1.0, max(0.0, float(value)))


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(UserError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg and msg.strip() == msg
    return msg


# ---- scoring -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dataset", DATASETS)
def test_scores_match_the_dataset_verifier(rg, dataset):
    t = task(dataset, val_size=4)
    assert t.weights == {"correctness": 0.9, "format": 0.1}
    examples = t.val_examples() + t.train_examples(4, random.Random(0))
    for ex in examples:
        assert ex.prompt == ex.meta["entry"]["question"] and ex.answer == ex.meta["entry"]["answer"]
        for response in (ex.answer, f"<answer>{ex.answer}</answer>", f"Working...\n{ex.answer}"):
            s = t.score(response, ex)
            assert s.components["correctness"] == 1.0 and s.correct, (dataset, response)
            assert s.total == pytest.approx(0.9 + 0.1 * s.components["format"])
        wrong = {ex.answer + "1", "0", "wrong", "-3", ex.answer[:-1]} - {ex.answer}
        partial = task(dataset, val_size=4, partial_credit=True)
        for response in wrong:
            s = t.score(response, ex)
            assert s.components["correctness"] == 0.0 and not s.correct, (dataset, response)
            if response == response.strip() and (response[-1:].isdigit() or "\n" in ex.answer):  # read as it is
                got = partial.score(response, ex).components["correctness"]
                assert got == verifier(rg, dataset, response, ex) < 1.0, (dataset, response)
        s = t.score("", ex)  # nothing to read: 0, never the verifier's value for an empty answer (countdown: 0.01)
        assert s.components == {"correctness": 0.0, "format": 0.0}


def test_partial_credit_only_when_asked(rg):
    ex = next(e for e in task("chain_sum", val_size=8).val_examples() if not e.answer.startswith("-"))
    response = "1" + ex.answer  # chain_sum credits a contained answer by length ratio
    expected = verifier(rg, "chain_sum", response, ex)
    assert 0 < expected < 1
    assert task("chain_sum", val_size=8).score(response, ex).components["correctness"] == 0.0
    s = task("chain_sum", val_size=8, partial_credit=True).score(response, ex)
    assert s.components["correctness"] == pytest.approx(expected) and not s.correct
    # the verifier scores the extracted answer, never the sentence around it
    s = task("chain_sum", val_size=1, partial_credit=True).score(f"The answer is {ex.answer}.", ex)
    assert s.components == {"correctness": 1.0, "format": 0.0} and s.fallback


def test_format_detection(rg):
    t = task("chain_sum", val_size=1)
    ex = t.val_examples()[0]
    a = ex.answer
    cases = {  # response -> (correctness, format)
        a: (1.0, 1.0),
        f"  {a}\n": (1.0, 1.0),
        f"<answer>{a}</answer>": (1.0, 1.0),
        f"<answer> {a} </answer>": (1.0, 1.0),
        f"Let me add them up.\n<answer>{a}</answer>\nDone.": (1.0, 1.0),
        f"<answer>0</answer> no wait <answer>{a}</answer>": (1.0, 1.0),  # the last tag pair counts
        f"Let me add them up.\n{a}": (1.0, 0.0),  # right answer on the last line, but not bare
        f"{a}\n\nsome afterthought": (1.0, 0.0),  # auto: the last number, not the asked form
        f"<answer>{a}": (1.0, 0.0),  # unclosed: not the asked form; the last number is read
        f"The final answer to the given arithmetic problem is {a}.": (1.0, 0.0),
        f"{a} + 1 = {int(a) + 1}": (0.0, 0.0),  # the last number is the one read
    }
    for response, (correctness, fmt) in cases.items():
        s = t.score(response, ex)
        assert (s.components["correctness"], s.components["format"]) == (correctness, fmt), response
    assert t.score(" ", ex).components["format"] == 0.0
    assert t.score("<answer></answer>", ex).components["format"] == 0.0  # empty tags hold no answer
    assert t.score("<answer> </answer>", ex).components["format"] == 0.0
    strict = task("chain_sum", val_size=1, answer_extraction="strict")
    assert strict.score(f"The answer is {a}.", ex).components == {"correctness": 0.0, "format": 0.0}
    assert strict.score(f"<answer>{a}</answer>", ex).components == {"correctness": 1.0, "format": 1.0}
    flexible = task("chain_sum", val_size=1, answer_extraction="flexible")
    assert flexible.score(f"<answer>{a}</answer> or maybe 0", ex).components == {"correctness": 0.0, "format": 1.0}


def test_multi_line_answers(rg):
    t = task("rotate_matrix", val_size=1)
    ex = t.val_examples()[0]
    assert "\n" in ex.answer
    assert t.score(ex.answer, ex).components == {"correctness": 1.0, "format": 1.0}
    assert t.score(f"Rotating clockwise:\n{ex.answer}", ex).components == {"correctness": 1.0, "format": 0.0}
    assert t.score(ex.answer.splitlines()[-1], ex).components["correctness"] < 1.0


def test_length_units_and_sft_target(rg):
    t = task("chain_sum", val_size=1, length_unit="tokens")
    ex = t.val_examples()[0]
    assert t.score(ex.answer, ex, num_tokens=7).actual_length == 7
    assert task("chain_sum", val_size=1).score("12345", ex).actual_length == 5
    assert t.sft_target(ex) == ex.answer and t.score(t.sft_target(ex), ex, 2).components["format"] == 1.0
    t = task("chain_sum", val_size=1, weights={"format": 0.5})
    assert t.weights == {"correctness": 0.9, "format": 0.5}


# ---- data ----------------------------------------------------------------------------------------

def test_train_and_val_are_disjoint_and_reproducible(rg):
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # a few hundred distinct questions
    a, b = task("chain_sum", small, seed=3, val_size=40), task("chain_sum", small, seed=3, val_size=40)
    val = [e.prompt for e in a.val_examples()]
    assert val == [e.prompt for e in b.val_examples()] and len(set(val)) == 40
    assert val != [e.prompt for e in task("chain_sum", small, seed=4, val_size=40).val_examples()]
    train_a = [e.prompt for e in a.train_examples(2000, random.Random(5))]
    assert train_a == [e.prompt for e in b.train_examples(2000, random.Random(5))]
    assert train_a != [e.prompt for e in b.train_examples(2000, random.Random(6))]
    assert not set(train_a) & set(val) and len(set(train_a)) > 40
    assert all(e.meta["split"] == "train" for e in a.train_examples(3, random.Random(0)))
    # Changing val_size does not change the training dataset, only which draws are excluded.
    c = task("chain_sum", seed=3, val_size=2)
    d = task("chain_sum", seed=3, val_size=5)
    assert [e.prompt for e in c.train_examples(20, random.Random(1))] == \
        [e.prompt for e in d.train_examples(20, random.Random(1))]
    assert task("chain_sum", val_size=0).val_examples() == []


def test_dataset_seeds():
    from rlgrad.tasks.reasoning_gym import TRAIN_SEED_OFFSET, dataset_seeds

    for seed in (0, 1, 2, 12345):
        train, val = dataset_seeds(seed)
        assert train - val == TRAIN_SEED_OFFSET and 0 <= val < TRAIN_SEED_OFFSET and train < 2**31
    assert dataset_seeds(0) != dataset_seeds(1)


def test_generator_options_and_pool_size(rg):
    t = task("chain_sum", {"min_terms": 3, "max_terms": 3, "size": 50}, val_size=2)
    assert all(len(e.meta["entry"]["metadata"]["expression"].split()) == 5 for e in t.val_examples())
    idx = {e.meta["index"] for e in t.train_examples(200, random.Random(0))}
    assert max(idx) < 50
    # One warm-start cache per dataset and options.
    assert t.name.startswith("reasoning_gym-chain_sum-")
    assert task("chain_sum", val_size=1).name == "reasoning_gym-chain_sum"
    assert "reasoning_gym" in TASK_NAMES


def test_cli_settings_object_is_accepted(rg):
    from rlgrad.config.load import load_config

    cfg = load_config(overrides=["data.task=reasoning_gym", "data.reasoning_gym.dataset=chain_sum",
                                 "data.reasoning_gym.config.max_terms=2"])
    t = build_task(cfg.data.task, val_size=3, reasoning_gym=cfg.data.reasoning_gym)
    assert all(e.meta["entry"]["metadata"]["num_terms"] == 2 for e in t.val_examples())


# ---- bad input -----------------------------------------------------------------------------------

def test_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym -> ImportError
    msg = one_line_error(task, "chain_sum")
    assert "pip install 'rlgrad[reasoning]'" in msg


def test_bad_input(rg):
    for missing in (None, ""):
        assert "data.reasoning_gym.dataset" in one_line_error(task, missing)
    assert "data.reasoning_gym.dataset" in one_line_error(build_task, "reasoning_gym")
    msg = one_line_error(task, "chainsum")
    assert "'chainsum'" in msg and "chain_sum" in msg
    msg = one_line_error(task, "zzzzzz")
    assert "'zzzzzz'" in msg and "datasets" in msg
    msg = one_line_error(task, "chain_sum", {"min_term": 2})
    assert "'min_term'" in msg and "min_terms" in msg
    msg = one_line_error(task, "chain_sum", {"min_terms": 0})  # the library's own validation
    assert "chain_sum" in msg and "min_terms" in msg
    msg = one_line_error(task, "basic_arithmetic", {"operators": ["%"]})
    assert "basic_arithmetic" in msg
    assert "trainer.seed" in one_line_error(task, "chain_sum", {"seed": 1})
    assert "size" in one_line_error(task, "chain_sum", {"size": 0})
    assert "word_ladder" in one_line_error(task, "word_ladder", {"size": 10**6})  # the library's size limit
    assert "length" in one_line_error(task, "chain_sum", weights={"length": 1.0})
    one_line_error(build_task, "reasoning_gym", train_files=["x.jsonl"], reasoning_gym={"dataset": "chain_sum"})


# ---- end to end ----------------------------------------------------------------------------------

def test_one_step_cli_run(rg, model_cache, tmp_path):
    from rlgrad.cli import main
    from rlgrad.runfiles import read_jsonl

    run = tmp_path / "run"
    args = tiny_overrides(model_cache, run) + [
        "data.task=reasoning_gym", "data.reasoning_gym.dataset=chain_sum",
        "data.reasoning_gym.config.max_terms=2", "data.reasoning_gym.config.max_digits=2",
        "model.warmstart_steps=0", "trainer.total_training_steps=1", "trainer.test_freq=1"]
    assert main(["train", *args]) == 0
    rows = read_jsonl(run / "metrics.jsonl")
    step1 = next(r["data"] for r in rows if r["step"] == 1)
    for key in ("reward/correctness/mean", "reward/format/mean", "critic/score/mean", "val/accuracy"):
        assert key in step1, key
    lines = [json.loads(x) for x in (run / "reward_components.jsonl").read_text().splitlines() if x.strip()]
    assert lines[-1]["components"] == ["correctness", "format"]
    assert lines[-1]["weights"] == {"correctness": 0.9, "format": 0.1}


def test_cli_bad_dataset_is_one_line(rg, model_cache, tmp_path, capsys):
    from rlgrad.cli import main

    args = tiny_overrides(model_cache, tmp_path / "run") + ["data.task=reasoning_gym",
                                                            "data.reasoning_gym.dataset=chainsum"]
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'chainsum'" in err[0] and "chain_sum" in err[0]
    assert not (tmp_path / "run").exists()
