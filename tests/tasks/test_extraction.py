"""Answer extraction (reward.answer_extraction): strict, flexible (verl's GSM8K reading) and auto, on the
datasets rlgrad's presets and docs use, and the same rules in math and countdown."""

import pytest

from rlgrad.tasks import Example, build_task
from rlgrad.tasks.extraction import bare_answer, extract, flexible_answer, is_numeric, last_number
from rlgrad.tasks.math import MathTask


@pytest.mark.parametrize("response,expected", [
    ("The final answer to the given arithmetic problem is 4.", "4"),  # a sentence's closing period
    ("5 + 7 = 12", "12"),  # several numbers: the last
    ("It is -4, I think.", "-4"),  # negative
    ("We get 1,234 apples.", "1234"),  # thousands comma
    ("0.5 of it", "0.5"),
    ("no digits here", None),  # none
    ("...", None),
    ("between 3 and 4.5.", "4.5"),
])
def test_last_number_reads_as_verl_flexible_then_cleans(response, expected):
    assert last_number(response) == expected


def test_is_numeric():
    assert all(is_numeric(x) for x in ("42", "-3", "0.5", "1,000", " 7 "))
    assert not any(is_numeric(x) for x in ("x+1", "[1, 2]", "", None, "1 2"))


def test_bare_answer_is_the_whole_response():
    assert bare_answer(" -4 ", "-4") == "-4" and bare_answer("4.", "4") == "4"
    assert bare_answer("It is 4", "4") is None and bare_answer("<answer>4</answer>", "4") is None
    assert bare_answer("a b\nc d", "x y\nz w") == "a b\nc d"  # a grid answer: its line count
    assert bare_answer("a\nb\nc", "x\ny") is None


@pytest.mark.parametrize("mode,answer,asked,fallback", [
    ("strict", None, False, False),
    ("flexible", "12", False, True),
    ("auto", "12", False, True),
])
def test_modes_on_a_sentence(mode, answer, asked, fallback):
    read = extract("so 5 + 7 = 12.", "12", mode, lambda text: bare_answer(text, "12"))
    assert (read.answer, read.asked_form, read.fallback) == (answer, asked, fallback)


def test_auto_prefers_the_asked_form_and_flexible_ignores_it():
    def strict(text):
        return "3" if "<answer>3</answer>" in text else None

    assert extract("<answer>3</answer> not 5", "3", "auto", strict).answer == "3"
    assert extract("<answer>3</answer> not 5", "3", "flexible", strict).answer == "5"
    with pytest.raises(ValueError):
        extract("3", "3", "lenient", strict)
    assert flexible_answer("line one\nthe grid", "a\nb") == "line one\nthe grid"


@pytest.fixture(scope="module")
def rg():
    return pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize("dataset,config", [
    ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    ("basic_arithmetic", {}),
    ("letter_counting", {}),
    ("gcd", {}),
])
def test_reasoning_gym_datasets(rg, dataset, config):
    """For each dataset: the bare answer and tags are the asked form; a sentence is read in auto/flexible only;
    a sentence with the wrong number last, and a response with no number, score 0; the verifier sees the
    extracted answer, so a right answer in a sentence scores 1, never partial credit."""
    spec = {"dataset": dataset, "config": config}
    auto = build_task("reasoning_gym", reasoning_gym=spec, val_size=4)
    strict = build_task("reasoning_gym", reasoning_gym=spec, val_size=4, answer_extraction="strict")
    for ex in auto.val_examples():
        a = ex.answer
        for response in (a, f"<answer>{a}</answer>", f"Thinking.\n<answer>{a}</answer>"):
            for task in (auto, strict):
                s = task.score(response, ex)
                assert s.components == {"correctness": 1.0, "format": 1.0} and not s.fallback, (dataset, response)
        sentence = f"The answer to the question is {a}."
        assert auto.score(sentence, ex).components == {"correctness": 1.0, "format": 0.0}
        assert auto.score(sentence, ex).fallback
        assert strict.score(sentence, ex).components == {"correctness": 0.0, "format": 0.0}
        wrong = str(int(a) + 1)
        assert auto.score(f"{a} is close, but it is {wrong}", ex).components["correctness"] == 0.0
        assert auto.score("I do not know.", ex).components == {"correctness": 0.0, "format": 0.0}


def test_config_key_and_its_reasoning_gym_alias(rg):
    from rlgrad.config.load import load_config

    cfg = load_config(overrides=["data.reasoning_gym.answer_extraction=strict",
                                 "data.reasoning_gym.partial_credit=true"])
    assert cfg.reward.answer_extraction == "strict" and cfg.reward.partial_credit is True
    from rlgrad.errors import UserError

    with pytest.raises(UserError, match="answer_extraction"):
        load_config(overrides=["reward.answer_extraction=lenient"])


def test_math_reads_a_box_strictly_and_the_last_number_flexibly(tmp_path):
    rows = tmp_path / "m.jsonl"
    rows.write_text('{"prompt": "1+1?", "answer": "2"}\n' * 5)
    ex = Example("1+1?", "2")
    auto = MathTask([str(rows)])
    strict = MathTask([str(rows)], answer_extraction="strict")
    assert auto.score("so \\boxed{2}", ex).components["correctness"] == 1.0
    assert auto.score("The answer is 2.", ex).components["correctness"] == 1.0
    assert auto.score("The answer is 2.", ex).fallback and not auto.score("\\boxed{2}", ex).fallback
    assert strict.score("The answer is 2.", ex).components["correctness"] == 0.0
    assert auto.score("\\boxed{3} but really 2", ex).components["correctness"] == 0.0  # the box wins in auto
