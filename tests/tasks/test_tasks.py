import random
import re
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from rlgrad.errors import UserError
from rlgrad.tasks import Example, build_task
from rlgrad.tasks import countdown as cd
from rlgrad.tasks.arithmetic import DIFFICULTY_MIX, TEACHER_SLIP, draw_example
from rlgrad.tasks.math import (
    correctness_score,
    extract_boxed_answer,
    format_score,
    last_boxed_only_string,
    length_score,
    normalize_answer,
    remove_boxed,
)

DATA = Path(__file__).resolve().parents[1] / "data"


# ---- arithmetic ------------------------------------------------------------------------------

def _solve(prompt: str) -> int:
    a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", prompt).groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


def test_arithmetic_prompts_and_answers():
    rng = random.Random(0)
    for level in (1, 2, 3, 4):
        for _ in range(200):
            ex = draw_example(rng, level)
            assert re.fullmatch(r"[0-9+\-*= ]+", ex.prompt)
            assert ex.answer == str(_solve(ex.prompt))
            assert ex.meta["difficulty"] == level
    assert re.fullmatch(r"\d\+\d=", draw_example(rng, 1).prompt)
    for _ in range(20):
        ex = draw_example(rng, 2)
        assert re.fullmatch(r"\d-\d\d=", ex.prompt) and ex.answer.startswith("-")
        assert re.fullmatch(r"\d\d\+\d=|\d\+\d\d=", draw_example(rng, 3).prompt)
        assert re.fullmatch(r"\d\d[-+]\d\d=", draw_example(rng, 4).prompt)


@pytest.mark.parametrize("response,correctness,fmt,total", [
    ("82", 1.0, 1.0, 1.0),
    (" 82\n", 1.0, 1.0, 1.0),
    ("082", 1.0, 1.0, 1.0),
    ("+82", 1.0, 0.0, 0.9),   # parses as 82 but is not a bare integer
    ("83", 0.0, 1.0, 0.1),
    ("-82", 0.0, 1.0, 0.1),
    ("82 apples", 0.0, 0.0, 0.0),
    ("8 2", 0.0, 0.0, 0.0),
    ("", 0.0, 0.0, 0.0),
    ("eighty-two", 0.0, 0.0, 0.0),
])
def test_arithmetic_score(response, correctness, fmt, total):
    task = build_task("arithmetic", val_size=4)
    s = task.score(response, Example("37+45=", "82", {"difficulty": 3}))
    assert s.components == {"correctness": correctness, "format": fmt}
    assert s.total == pytest.approx(total)
    assert s.correct is (correctness == 1.0)
    assert s.actual_length == len(response)


def test_arithmetic_negative_answer():
    task = build_task("arithmetic", val_size=4)
    ex = Example("12-45=", "-33", {"difficulty": 4})
    assert task.score("-33", ex).total == pytest.approx(1.0)
    assert task.score("33", ex).total == pytest.approx(0.1)
    assert task.score("--33", ex).total == 0.0
    assert task.sft_target(ex) == "-33"


def test_arithmetic_difficulty_mix_and_sft_targets():
    task = build_task("arithmetic", seed=3)
    train = task.train_examples(4000, random.Random(1))
    counts = Counter(ex.meta["difficulty"] for ex in train)
    assert set(counts) == {1, 2, 3, 4}
    for level, p in DIFFICULTY_MIX.items():  # 4000 draws give <= 0.8% std
        assert abs(counts[level] / 4000 - p) < 0.04
    assert set(Counter(ex.meta["difficulty"] for ex in task.val_examples())) == {1, 2, 3, 4}
    for ex in train[:200]:
        assert task.score(task.sft_target(ex), ex).correct


def test_arithmetic_sloppy_warmstart_teacher():
    """The warm-start teacher drops the minus sign of a negative result with prob. TEACHER_SLIP, nothing else."""
    task = build_task("arithmetic", seed=3)
    rng = random.Random(0)
    slips = negatives = 0
    for ex in task.train_examples(4000, random.Random(2)):
        target = task.warmstart_target(ex, rng)
        if ex.answer.startswith("-"):
            negatives += 1
            assert target in (ex.answer, ex.answer[1:])
            slips += target != ex.answer
        else:
            assert target == ex.answer
        assert task.sft_target(ex) == ex.answer
    assert negatives > 1000
    assert abs(slips / negatives - TEACHER_SLIP) < 0.05
    wrong = Example("5-47=", "-42", {"difficulty": 2})
    assert task.score("42", wrong).total == pytest.approx(0.1)  # the slip is a well-formed wrong answer


def test_arithmetic_val_deterministic_and_disjoint():
    a, b = build_task("arithmetic", seed=7, val_size=64), build_task("arithmetic", seed=7, val_size=64)
    va = [e.prompt for e in a.val_examples()]
    assert va == [e.prompt for e in b.val_examples()] == [e.prompt for e in a.val_examples()]
    assert len(va) == 64 and len(set(va)) == 64
    assert va != [e.prompt for e in build_task("arithmetic", seed=8, val_size=64).val_examples()]
    train = a.train_examples(5000, random.Random(0))
    assert not {e.prompt for e in train} & set(va)
    # same rng state -> same training prompts
    assert [e.prompt for e in a.train_examples(50, random.Random(5))] == \
        [e.prompt for e in b.train_examples(50, random.Random(5))]


def test_weights_override_and_errors():
    task = build_task("arithmetic", weights={"format": 0.5})
    assert task.weights == {"correctness": 0.9, "format": 0.5}
    assert task.score("83", Example("37+45=", "82")).total == pytest.approx(0.5)
    assert build_task("arithmetic", weights={}).weights == {"correctness": 0.9, "format": 0.1}
    with pytest.raises(UserError, match="'length'"):
        build_task("arithmetic", weights={"length": 1.0})
    with pytest.raises(UserError, match="'lenght'"):
        build_task("math", train_files=[str(DATA / "math_train.jsonl")], weights={"lenght": 1.0})
    with pytest.raises(UserError, match="'sudoku'"):
        build_task("sudoku")
    with pytest.raises(UserError, match="length_unit"):
        build_task("arithmetic", length_unit="words")
    with pytest.raises(UserError, match="train_files"):
        build_task("arithmetic", train_files=["x.jsonl"])


def test_length_unit_tokens_sets_actual_length():
    task = build_task("arithmetic", val_size=4, length_unit="tokens")
    assert task.score("82", Example("37+45=", "82"), num_tokens=3).actual_length == 3


# ---- countdown -------------------------------------------------------------------------------

@pytest.mark.parametrize("expr,value,numbers", [
    ("2+3*4", 14, [2, 3, 4]),
    ("(2+3)*4", 20, [2, 3, 4]),
    ("7-2-1", 4, [7, 2, 1]),          # left-associative
    ("8/4/2", 1, [8, 4, 2]),
    ("8/(4/2)", 4, [8, 4, 2]),
    ("8/3", Fraction(8, 3), [8, 3]),  # exact, not truncated or float
    (" 25 + 3 * 7 ", 46, [25, 3, 7]),
    ("-3+5", 2, [3, 5]),
    ("((5))", 5, [5]),
])
def test_countdown_evaluate(expr, value, numbers):
    got = cd.evaluate_expression(expr)
    assert got is not None
    assert got[0] == value and isinstance(got[0], Fraction)
    assert got[1] == numbers


@pytest.mark.parametrize("expr", [
    "", "2+", "(2+3", "2+3)", "2 3", "2**3", "4//2", "2^3", "2+x", "1e3", "3.5+1", "2=2",
    "__import__('os').system('true')", "()",
])
def test_countdown_rejects_junk(expr):
    assert cd.parse_expression(expr) is None
    assert cd.evaluate_expression(expr) is None


def test_countdown_division_by_zero_is_invalid_but_well_formed():
    assert cd.parse_expression("5/(3-3)") is not None
    assert cd.evaluate_expression("5/(3-3)") is None
    task = build_task("countdown", val_size=2)
    s = task.score("5/(3-3)", Example("3 3 5 -> 5:", "5", {"numbers": [3, 3, 5], "target": 5}))
    assert s.components == {"correctness": 0.0, "format": 1.0}


def test_countdown_never_uses_eval():
    src = Path(cd.__file__).read_text()
    assert not re.search(r"(?<![\w_])eval\(", src)
    assert "import ast" not in src and "literal_eval" not in src


@pytest.mark.parametrize("response,correctness,fmt", [
    ("25+3*7", 1.0, 1.0),
    ("3*7+25", 1.0, 1.0),
    ("(7*3)+25", 1.0, 1.0),
    ("(25+3)*7", 0.0, 1.0),        # precedence matters: 196
    ("25+21", 0.0, 1.0),           # right value, wrong numbers
    ("25+25-7+3", 0.0, 1.0),       # 46, but 25 is used twice
    ("25+3*7+0", 0.0, 1.0),        # extra number
    ("25+3*7=46", 1.0, 0.0),       # auto: not the asked form, but the expression is read (flexible)
    ("The answer is 25 + 3*7", 1.0, 0.0),
    ("25+3x7", 0.0, 0.0),
    ("", 0.0, 0.0),
])
def test_countdown_score(response, correctness, fmt):
    task = build_task("countdown", val_size=2)
    ex = Example("3 7 25 -> 46:", "46", {"numbers": [3, 7, 25], "target": 46, "solution": "25+3*7"})
    s = task.score(response, ex)
    assert s.components == {"correctness": correctness, "format": fmt}
    assert s.fallback == (fmt == 0.0)
    strict = build_task("countdown", val_size=2, answer_extraction="strict").score(response, ex)
    assert strict.components == {"correctness": correctness if fmt else 0.0, "format": fmt}
    assert s.total == pytest.approx(0.9 * correctness + 0.1 * fmt)


def test_countdown_exact_fractions_in_intermediate_steps():
    task = build_task("countdown", val_size=2)
    ex = Example("2 3 4 -> 6:", "6", {"numbers": [2, 3, 4], "target": 6})
    assert task.score("3/2*4", ex).correct          # 3/2 is not an integer, but the value is exactly 6
    assert not task.score("4/3*2", ex).correct      # 8/3


def test_countdown_generated_instances_are_solvable():
    task = build_task("countdown", seed=1, val_size=32)
    examples = task.train_examples(300, random.Random(0)) + task.val_examples()
    assert {len(e.meta["numbers"]) for e in examples} == {3, 4}
    for ex in examples:
        nums, target = ex.meta["numbers"], ex.meta["target"]
        assert ex.prompt == " ".join(map(str, nums)) + f" -> {target}:"
        assert nums == sorted(nums)  # prompt order must not leak the solution order
        assert all(1 <= n <= 25 for n in nums) and 1 <= target <= 100
        s = task.score(task.sft_target(ex), ex)
        assert s.correct and s.total == pytest.approx(1.0), ex


def test_countdown_val_deterministic_and_disjoint():
    a, b = build_task("countdown", seed=2, val_size=40), build_task("countdown", seed=2, val_size=40)
    va = [e.prompt for e in a.val_examples()]
    assert va == [e.prompt for e in b.val_examples()] and len(set(va)) == 40
    assert not {e.prompt for e in a.train_examples(500, random.Random(3))} & set(va)


# ---- math: extraction and normalisation ------------------------------------------------------

def test_boxed_extraction():
    assert last_boxed_only_string(r"a \boxed{1} b \boxed{x^{2}} c") == r"\boxed{x^{2}}"
    assert extract_boxed_answer(r"so \boxed{\frac{\sqrt{3}}{2}}.") == r"\frac{\sqrt{3}}{2}"
    assert extract_boxed_answer(r"\boxed{\{1,2\}}") == r"\{1,2\}"
    assert extract_boxed_answer(r"\boxed{\left\{1\right.}") == r"\left\{1\right."   # \{ is not a group
    assert extract_boxed_answer(r"\fbox{7}") == "7"
    assert extract_boxed_answer(r"\boxed{1} then \fbox{8}") == "8"
    assert extract_boxed_answer(r"the answer is $\boxed 5$") == "5"
    assert extract_boxed_answer(r"\boxed 12.") == "12."
    assert extract_boxed_answer(r"\boxed5") == "5"
    assert last_boxed_only_string(r"\fboxsep=2pt") is None   # a different command, not a box
    assert extract_boxed_answer("the answer is 5") is None
    assert extract_boxed_answer(r"\boxed{5") is None
    assert remove_boxed(r"\boxed{12}") == "12"
    assert remove_boxed(r"\boxed 12") == "12"
    assert remove_boxed("12") is None
    assert remove_boxed(r"\boxed{1}{2}") is None


@pytest.mark.parametrize("raw,norm", [
    (r"\frac12", r"\frac{1}{2}"),
    (r"\frac{1}2", r"\frac{1}{2}"),
    (r"\dfrac{1}{2}", r"\frac{1}{2}"),
    (r"\tfrac12", r"\frac{1}{2}"),
    ("1/2", r"\frac{1}{2}"),
    ("-3/4", r"-\frac{3}{4}"),
    (r"\frac1b", r"\frac{1}{b}"),
    (r"\frac{\frac12}{3}", r"\frac{\frac{1}{2}}{3}"),
    (r"\sqrt2", r"\sqrt{2}"),
    ("1,000", "1000"),
    ("1,000,000", "1000000"),
    ("(1,2)", "(1,2)"),
    (r"90^\circ", "90"),
    (r"90^{\circ}", "90"),
    (r"5\text{ cm}", "5"),
    (r"5 \mbox{cm}", "5"),
    (r"12.\text{ m}", "12"),
    (r"\text{Monday}", "Monday"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"\$5.", "5"),
    ("$7$", "7"),
    (r"50\%", "50"),
    ("50%", "50"),
    (".5", "0.5"),
    ("x = 5", "5"),
    (r"3\!\,000", "3000"),
])
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


@pytest.mark.parametrize("response,truth,expected", [
    (r"\boxed{\dfrac12}", r"\frac{1}{2}", 1.0),      # both sides normalised
    (r"\boxed{1/2}", r"\frac12", 1.0),
    (r"\boxed{\frac{1}{2}}", "1/2", 1.0),
    (r"\boxed{5\text{ cm}}", "5", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\fbox{42}", "42", 1.0),
    (r"so $\boxed 42$", "42", 1.0),
    ("The answer is 5.", "5", 0.0),                  # no box
    (r"\boxed{6}", "5", 0.0),
    (r"\boxed{5} no wait \boxed{6}", "5", 0.0),     # last box wins
    (r"\boxed{}", "5", 0.0),
])
def test_correctness_score(response, truth, expected):
    assert correctness_score(response, truth) == expected


@pytest.mark.parametrize("response,expected", [
    ("", 0.0),
    ("First, x. Second, y.", 0.5),
    ("First, x. Second, y. \\boxed{1}", 0.9),
    ("Step 1: a\nStep 2: b", 0.5),
    ("step\n1 and st ep2", 0.25),                          # only spaces are removed: "step\n1" does not count
    ("Firstly, secondly, a third.", 0.25),                # whole words only
    ("\\BOXED{3}", 0.4),
    ("first first first", 0.25),
    ("FIRST SECOND THIRD step 1 step 2 \\boxed{}", 1.0),   # 1.65 capped
])
def test_format_score(response, expected):
    assert format_score(response) == pytest.approx(expected)


def test_length_score():
    assert length_score("", 10) == 0.0
    assert length_score("a" * 5, 10) == pytest.approx(0.5)
    assert length_score("a" * 10, 10) == pytest.approx(1.0)
    assert length_score("a" * 15, 10) == pytest.approx(0.5)
    assert length_score("a" * 20, 10) == 0.0
    assert length_score("a" * 30, 10) == 0.0
    assert length_score("xx", 10, "tokens", num_tokens=8) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        length_score("xx", 10, "tokens")


def test_math_task_score_and_sft_target():
    task = build_task("math", train_files=[str(DATA / "math_train.jsonl")], length_max=40)
    ex = Example("What is 6 times 7?", "42")
    response = "First, add. \\boxed{42}"  # 22 chars
    s = task.score(response, ex)
    assert s.components == pytest.approx({"correctness": 1.0, "format": 0.65, "length": 0.55})
    assert s.total == pytest.approx(0.34 + 0.33 * 0.65 + 0.33 * 0.55)
    assert s.correct and s.actual_length == 22
    assert task.score(task.sft_target(ex), ex).correct
    frac = Example("q", r"\frac{3}{4}")
    assert task.score(task.sft_target(frac), frac).correct
    no_len = build_task("math", train_files=[str(DATA / "math_train.jsonl")], weights={"length": 0})
    assert no_len.weights == {"correctness": 0.34, "format": 0.33, "length": 0.0}
    tok = build_task("math", train_files=[str(DATA / "math_train.jsonl")], length_unit="tokens", length_max=10)
    assert tok.score(response, ex, num_tokens=5).components["length"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        tok.score(response, ex)


# ---- math: data loading ----------------------------------------------------------------------

def test_math_loading_jsonl_layouts_and_holdout():
    task = build_task("math", train_files=[str(DATA / "math_train.jsonl")])
    val = task.val_examples()
    # 10 rows, no val_files -> the last min(128, 10 // 5) = 2 rows are held out
    assert [e.prompt for e in val] == ["What is 1 plus 1?", "What is 8 minus 8?"]
    train = task.train_examples(400, random.Random(0))
    by_prompt = {e.prompt: e for e in train}
    assert len(by_prompt) == 8
    gsm = by_prompt["Ann has 2 apples and buys 1,005 more. How many apples does she have?"]
    assert gsm.answer == "1007" and gsm.meta["layout"] == "gsm8k"
    assert by_prompt["What is $\\frac{1}{2} + \\frac{1}{4}$?"].answer == r"\frac{3}{4}"
    assert by_prompt["Compute $2^{10}$."].answer == "1024"          # explicit answer beats the box
    assert by_prompt["What is 6 times 7?"].answer == "42"           # non-string answer
    assert by_prompt["What is 6 times 7?"].meta["layout"] == "plain"
    assert [e.prompt for e in task.train_examples(20, random.Random(9))] == \
        [e.prompt for e in task.train_examples(20, random.Random(9))]


def test_math_loading_with_val_files():
    train, val = str(DATA / "math_train.jsonl"), str(DATA / "math_val.jsonl")
    task = build_task("math", train_files=[train], val_files=[val])
    assert [e.answer for e in task.val_examples()] == ["36", "2"]
    assert len({e.prompt for e in task.train_examples(500, random.Random(0))}) == 10
    assert len(build_task("math", train_files=[train], val_files=[val], val_size=1).val_examples()) == 1
    both = build_task("math", train_files=[train, val], val_files=[val])  # concatenated
    assert len({e.prompt for e in both.train_examples(800, random.Random(0))}) == 12


def test_math_loading_verl_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"data_source": "gsm8k",
         "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i}+{i}?"}],
         "reward_model": {"style": "rule", "ground_truth": str(2 * i)}}
        for i in range(14)
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    task = build_task("math", train_files=[str(path)])
    # held out: the last min(128, 14 // 5) = 2 rows
    assert [(e.prompt, e.answer) for e in task.val_examples()] == [("What is 12+12?", "24"), ("What is 13+13?", "26")]
    assert len({e.prompt for e in task.train_examples(300, random.Random(0))}) == 12
    assert [e.answer for e in build_task("math", train_files=[str(path)], val_size=1).val_examples()] == ["26"]
    assert all(e.meta["layout"] == "verl" for e in task.val_examples())


def _write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_an_unreadable_data_file_says_what_to_fix_and_nothing_is_written(tmp_path):
    """Issue 50: a training file without read permission was a 47-line PermissionError traceback. The read fails
    for real: as root, whom permissions do not stop, rlgrad runs with the capabilities that bypass them dropped."""
    import os
    import shutil
    import subprocess
    import sys

    data = Path(_write(tmp_path, "train.jsonl", '{"prompt": "1+1", "answer": "2"}\n' * 10))
    data.chmod(0)
    prefix = []
    if os.access(data, os.R_OK):
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop the capabilities that bypass permissions")
        caps = "-dac_override,-dac_read_search"
        prefix = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", "--"]
    run = tmp_path / "run"
    res = subprocess.run([*prefix, sys.executable, "-m", "rlgrad", "train", "data.task=math",
                          f"data.train_files=[{data}]", f"trainer.default_local_dir={run}"],
                         capture_output=True, text=True, timeout=300)
    assert (res.returncode, res.stderr) == (2, f"rlgrad: error: data file {data} cannot be read (Permission denied): "
                                               "make it readable, then run the same command again\n")
    assert not run.exists()


def test_math_loading_errors(tmp_path):
    bad = _write(tmp_path, "bad.jsonl", '{"prompt": "a", "answer": "1"}\n{"prompt": "b", \n')
    with pytest.raises(UserError, match=re.escape(f"{bad}:2")):
        build_task("math", train_files=[bad])
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match=re.escape(missing)):
        build_task("math", train_files=[missing])
    csv = _write(tmp_path, "d.csv", "prompt,answer\n")
    with pytest.raises(UserError, match=r"\.csv"):
        build_task("math", train_files=[csv])
    odd = _write(tmp_path, "odd.jsonl", '{"prompt": "a", "answer": "1"}\n{"text": "b"}\n')
    with pytest.raises(UserError, match=re.escape(f"{odd}:2") + ".*no supported layout"):
        build_task("math", train_files=[odd])
    unboxed = _write(tmp_path, "u.jsonl", '{"problem": "p", "solution": "it is 3"}\n')
    with pytest.raises(UserError, match=re.escape(f"{unboxed}:1")):
        build_task("math", train_files=[unboxed])
    with pytest.raises(UserError, match="train_files"):
        build_task("math")


def test_math_without_validation_rows_is_refused_naming_the_way_out(tmp_path):
    """Issue 50: a one-row training file trained with no validation rows and logged val/accuracy as "nan". A split
    that leaves validation empty is refused; five rows hold one out; data.val_files names them instead."""
    rows = [f'{{"prompt": "{i} + {i}", "answer": "{2 * i}"}}\n' for i in range(5)]
    for n in (1, 4):
        few = _write(tmp_path, f"few{n}.jsonl", "".join(rows[:n]))
        refusal = (rf"^task 'math': {n} training row\(s\) in {re.escape(few)}, too few to hold out validation rows "
                   r".* name the validation rows with data\.val_files$")
        with pytest.raises(UserError, match=refusal):
            build_task("math", train_files=[few])
    five = build_task("math", train_files=[_write(tmp_path, "five.jsonl", "".join(rows))])
    assert [e.prompt for e in five.val_examples()] == ["4 + 4"]
    one = _write(tmp_path, "one.jsonl", rows[0])
    assert [e.prompt for e in build_task("math", train_files=[one], val_files=[one]).val_examples()] == ["0 + 0"]
    blank = _write(tmp_path, "blank.jsonl", "\n")
    with pytest.raises(UserError, match=rf"^task 'math': no validation rows in {re.escape(blank)}$"):
        build_task("math", train_files=[one], val_files=[blank])
