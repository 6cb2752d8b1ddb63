"""Math word problems (GSM8K / MATH style) from local jsonl or parquet files.

Row layouts, detected per row:

* verl: ``prompt`` is a list of chat messages (the last user message is the
  question), ground truth in ``reward_model.ground_truth``;
* GSM8K: ``question`` + ``answer`` ending in ``#### 42``;
* MATH: ``problem`` + ``solution`` with a ``\\boxed{}`` answer, or an explicit ``answer`` (which wins);
* plain: ``prompt`` (string) + ``answer``.

Without ``val_files`` the last ``min(val_size, len(train) // 5)`` training rows
are held out as the validation set; with ``val_files`` their first ``val_size``
rows are the validation set and all training rows are used for training. A split
with no validation row (fewer than 5 training rows, empty ``val_files``) is refused.

Reward components: ``correctness`` (the answer equals the ground truth after LaTeX normalisation of both; the
answer is the last boxed one, or under ``reward.answer_extraction=auto|flexible`` the last number of a response
without a box, as verl's GSM8K ``flexible`` reads it), ``format`` (step-by-step keywords and a box) and
``length`` (peaks at ``length_max``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from pathlib import Path
from typing import Any

from rlgrad.errors import UserError
from rlgrad.tasks.base import Example, Score, make_score, resolve_weights, response_length
from rlgrad.tasks.extraction import Extraction, extract

DEFAULT_WEIGHTS = {"correctness": 0.34, "format": 0.33, "length": 0.33}
_BOX_COMMANDS = ("\\boxed", "\\fbox")


# ---- answer extraction -----------------------------------------------------------------------

def _match_brace(s: str, i: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``s[i]``; escaped braces ``\\{ \\}`` do not count."""
    depth, j = 0, i
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return None


def last_boxed_only_string(s: str) -> str | None:
    """The last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 5`` in ``s``, command included; None if absent
    or unclosed."""
    idx = max(s.rfind(cmd) for cmd in _BOX_COMMANDS)
    if idx < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if s.startswith(c, idx))
    i = idx + len(cmd)
    if i < len(s) and s[i].isalpha():  # a different command, e.g. \fboxsep
        return None
    while i < len(s) and s[i].isspace():
        i += 1
    if i < len(s) and s[i] == "{":
        end = _match_brace(s, i)
        return None if end is None else s[idx:end + 1]
    # Brace-less form: the next whitespace-delimited token, cut at a closing '$'.
    m = re.match(r"[^\s$]+", s[i:])
    if m is None:
        return None
    token = m.group().rstrip(",;:")
    return s[idx:i] + token if token else None


def remove_boxed(s: str) -> str | None:
    """Content of a string that is exactly one box (as returned by ``last_boxed_only_string``)."""
    for cmd in _BOX_COMMANDS:
        if not s.startswith(cmd):
            continue
        rest = s[len(cmd):]
        if rest.startswith("{"):
            return rest[1:-1] if _match_brace(rest, 0) == len(rest) - 1 else None
        if rest and not rest[0].isalpha():  # brace-less form: \boxed 5, \boxed5, \boxed\pi
            return rest.strip() or None
        return None
    return None


def extract_boxed_answer(s: str) -> str | None:
    boxed = last_boxed_only_string(s)
    return None if boxed is None else remove_boxed(boxed)


# ---- normalisation ---------------------------------------------------------------------------

def _take_arg(s: str, i: int) -> tuple[str | None, int]:
    """One TeX macro argument starting at ``s[i]``: a braced group, a control word or one character."""
    if i >= len(s):
        return None, i
    if s[i] == "{":
        end = _match_brace(s, i)
        return (None, i) if end is None else (s[i + 1:end], end + 1)
    m = re.match(r"\\[a-zA-Z]+", s[i:])
    if m:
        return m.group(), i + len(m.group())
    return s[i], i + 1


def _fix_fracs(s: str) -> str:
    """``\\frac12``, ``\\frac1b``, ``\\frac{1}2`` -> ``\\frac{1}{2}`` (recursively inside arguments)."""
    out, i = [], 0
    while (j := s.find("\\frac", i)) >= 0:
        out.append(s[i:j + 5])
        i = j + 5
        for _ in range(2):
            arg, i = _take_arg(s, i)
            if arg is None:  # malformed: leave the rest as written
                break
            out.append("{" + _fix_fracs(arg) + "}")
    out.append(s[i:])
    return "".join(out)


def normalize_answer(s: str) -> str:
    """Canonical string form of a LaTeX answer, in the spirit of the MATH benchmark's ``strip_string``."""
    s = str(s).strip().replace("\n", "")
    s = s.removesuffix(".")
    for thin_space in ("\\!", "\\,", "\\;", "\\:"):
        s = s.replace(thin_space, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "")
    s = s.replace("\\$", "").replace("$", "")
    # Units: a trailing \text{...} / \mbox{...} after some content (a lone \text{Monday} is the answer).
    while (m := re.fullmatch(r"(.*?\S)\s*\\(?:text|mbox)\{[^{}]*\}\s*", s, flags=re.S)):
        s = m.group(1)
    if m := re.fullmatch(r"\\(?:text|mbox)\{([^{}]*)\}", s.strip()):
        s = m.group(1)
    s = s.replace("\\%", "").replace("%", "")
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"\\sqrt([^{\[\\])", r"\\sqrt{\1}", s)
    s = _fix_fracs(s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)  # 1,000,000 -> 1000000; (1,2) untouched
    s = re.sub(r"(?<!\d)\.(?=\d)", "0.", s)  # .5 -> 0.5
    if s.count("=") == 1 and len(s.split("=")[0]) <= 2:  # x=5 -> 5
        s = s.split("=")[1]
    if m := re.fullmatch(r"(-?)(\d+)/(\d+)", s):
        s = f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    return s.removesuffix(".")


# ---- reward components -----------------------------------------------------------------------

def read_answer(response: str, ground_truth: str, mode: str = "strict") -> Extraction:
    """The answer under ``reward.answer_extraction`` ``mode``: strict is the last boxed answer, flexible the last
    number (a numeric ground truth) or the last line (``rlgrad.tasks.extraction``)."""
    return extract(response, ground_truth, mode, extract_boxed_answer)


def correctness_score(response: str, ground_truth: str, mode: str = "strict") -> float:
    """1.0 iff the answer read under ``mode`` (strict: the last boxed one) normalises to the normalised ground
    truth."""
    return answer_matches(read_answer(response, ground_truth, mode).answer, ground_truth)


def answer_matches(pred: str | None, ground_truth: str) -> float:
    """1.0 iff ``pred`` normalises to the normalised ground truth (None: nothing was read)."""
    if pred is None:
        return 0.0
    pred = normalize_answer(pred)
    return float(pred != "" and pred == normalize_answer(ground_truth))


def format_score(response: str) -> float:
    """Step-by-step markers in the lower-cased text (rldynamic's utils/rewards.py rule), capped at 1:

    +0.25 per whole word "first", "second", "third" ("firstly" does not count); +0.25 per "step1",
    "step2" once spaces (only spaces) are removed ("Step 1" counts); +0.4 for ``\\boxed``.
    """
    text = response.lower()
    no_spaces = text.replace(" ", "")
    score = 0.25 * sum(re.search(rf"\b{word}\b", text) is not None for word in ("first", "second", "third"))
    score += 0.25 * sum(step in no_spaces for step in ("step1", "step2"))
    score += 0.4 * ("\\boxed" in text)
    return min(1.0, score)


def length_score(response: str, length_max: int, length_unit: str = "chars", num_tokens: int | None = None) -> float:
    """Triangle peaking at ``length_max``: 0 for an empty response and for twice ``length_max`` or more."""
    n = response_length(response, num_tokens, length_unit)
    return max(0.0, 1.0 - abs(n / length_max - 1.0))


# ---- data loading ----------------------------------------------------------------------------

def _read_rows(path: str) -> list[tuple[str, Any]]:
    """(location for error messages, row) pairs of one data file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"data file not found: {path}")
    if p.suffix == ".jsonl":
        return _read_jsonl(path)
    if p.suffix == ".parquet":
        return _read_parquet(path)
    raise UserError(f"{path}: unsupported data file extension '{p.suffix}' (use .jsonl or .parquet)")


def _read_jsonl(path: str) -> list[tuple[str, Any]]:
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise _unreadable(path, e) from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append((f"{path}:{lineno}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
    return rows


def _read_parquet(path: str) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except PermissionError as e:
        raise _unreadable(path, e) from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read parquet ({e})") from None
    return [(f"{path}: row {i}", row) for i, row in enumerate(table.to_pylist())]


def _unreadable(path: str, e: OSError) -> UserError:
    """A data file the machine will not let us read (permissions): what to fix, and that the same command then
    runs (nothing was written)."""
    why = os.strerror(e.errno) if e.errno else str(e)
    return UserError(f"data file {path} cannot be read ({why}): make it readable, then run the same command again")


# Each layout reader: (question, ground truth, chat messages or None) of a row in its layout, None for another.
_Read = tuple[Any, Any, list[dict[str, str]] | None] | None


def _verl_row(row: dict, where: str) -> _Read:
    """verl: ``prompt`` is a list of chat messages, the answer is ``reward_model.ground_truth``."""
    prompt = row.get("prompt")
    if not isinstance(prompt, list):
        return None
    users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    reward_model = row.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if not users or not isinstance(users[-1], str) or truth is None:
        raise UserError(f"{where}: verl-style row needs a user message in 'prompt' and "
                        "'reward_model.ground_truth'")
    messages = [{"role": str(m.get("role")), "content": str(m.get("content"))} for m in prompt
                if isinstance(m, dict)]  # rendered as they are by the chat template
    return users[-1], truth, messages


def _gsm8k_row(row: dict, where: str) -> _Read:
    """GSM8K: ``question`` and ``answer``, the final answer after ``####``."""
    if "question" not in row or "answer" not in row:
        return None
    truth = row["answer"]
    if isinstance(truth, str) and "####" in truth:
        truth = truth.split("####")[-1].replace(",", "")
    return row["question"], truth, None


def _math_row(row: dict, where: str) -> _Read:
    """MATH: ``problem`` and ``answer``, or the ``\\boxed{}`` answer of its ``solution``."""
    if "problem" not in row or (row.get("answer") is None and "solution" not in row):
        return None
    truth = row.get("answer")
    if truth is None:
        truth = extract_boxed_answer(str(row["solution"]))
        if truth is None:
            raise UserError(f"{where}: no \\boxed{{...}} answer in 'solution' and no 'answer' field")
    return row["problem"], truth, None


def _plain_row(row: dict, where: str) -> _Read:
    """Plain: a text ``prompt`` and an ``answer``."""
    if not isinstance(row.get("prompt"), str) or "answer" not in row:
        return None
    return row["prompt"], row["answer"], None


_LAYOUTS = (("verl", _verl_row), ("gsm8k", _gsm8k_row), ("math", _math_row), ("plain", _plain_row))  # tried in order


def _read_row(row: dict, where: str) -> tuple[str, Any, Any, list[dict[str, str]] | None]:
    """(layout, question, ground truth, chat messages) of a row, by the first layout it matches."""
    for layout, read in _LAYOUTS:
        found = read(row, where)
        if found is not None:
            return (layout, *found)
    raise UserError(f"{where}: row matches no supported layout (verl prompt messages + "
                    "reward_model.ground_truth, question+answer, problem+solution/answer, prompt+answer); "
                    f"keys: {', '.join(sorted(map(str, row)))}")


def _row_to_example(row: Any, where: str) -> Example:
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected an object per row, got {type(row).__name__}")
    layout, question, truth, messages = _read_row(row, where)
    if truth is None or not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: " + ("null ground-truth answer" if truth is None else "empty or non-text prompt"))
    answer = str(truth).strip()
    if not answer:
        raise UserError(f"{where}: empty ground-truth answer")
    # What verl's reward function is given for the row (rlgrad.tasks.custom_reward): its data_source and
    # extra_info columns, and the ground truth: verl's reward_model.ground_truth as the file holds it (any type),
    # the answer as read above for the other layouts.
    verl = {"data_source": row.get("data_source"), "ground_truth": truth if layout == "verl" else answer,
            "extra_info": row.get("extra_info")}
    return Example(prompt=str(question), answer=answer, meta={"source": where, "layout": layout, "verl": verl},
                   messages=messages)


def load_examples(paths: list[str] | str) -> list[Example]:
    """All rows of ``paths``, concatenated in order."""
    if isinstance(paths, str | Path):
        paths = [paths]
    return [_row_to_example(row, where) for path in paths for where, row in _read_rows(str(path))]


class MathTask:
    name = "math"

    def __init__(self, train_files: list[str], val_files: list[str] | None = None, val_size: int = 128,
                 weights: dict[str, float] | None = None, length_max: int = 800, length_unit: str = "chars",
                 answer_extraction: str = "auto"):
        train_files = [train_files] if isinstance(train_files, str | Path) else list(train_files)
        if not train_files:
            raise UserError("task 'math' needs train_files (jsonl or parquet)")
        self.weights = resolve_weights(self.name, DEFAULT_WEIGHTS, weights)
        self.length_max, self.length_unit = length_max, length_unit
        self.answer_extraction = answer_extraction
        train = load_examples(train_files)
        if isinstance(val_files, str | Path):
            val_files = [val_files]
        if val_files:
            self._train, self._val = train, load_examples(val_files)[:val_size]
        else:
            k = min(val_size, len(train) // 5)
            self._train, self._val = train[:len(train) - k], train[len(train) - k:]
        if not self._train:
            raise UserError(f"task 'math': no training rows in {', '.join(map(str, train_files))}")
        if not self._val:  # a validation accuracy over no rows is no number: say so before anything runs
            raise UserError(f"task 'math': no validation rows in {', '.join(map(str, val_files))}" if val_files else
                            f"task 'math': {len(train)} training row(s) in {', '.join(map(str, train_files))}, too "
                            "few to hold out validation rows (a fifth of them: 5 rows at least); add rows, or name "
                            "the validation rows with data.val_files")

    def train_examples(self, n: int, rng: random.Random) -> list[Example]:
        return [self._train[rng.randrange(len(self._train))] for _ in range(n)]

    def val_examples(self) -> list[Example]:
        return list(self._val)

    def data_examples(self) -> list[Example]:
        return self._train + self._val

    def score(self, response: str, example: Example, num_tokens: int | None = None) -> Score:
        read = read_answer(response, example.answer, self.answer_extraction)
        components = {
            "correctness": answer_matches(read.answer, example.answer),
            "format": format_score(response),
            "length": length_score(response, self.length_max, self.length_unit, num_tokens),
        }
        return make_score(components, self.weights, response_length(response, num_tokens, self.length_unit),
                          fallback=read.fallback)

    def warmstart_spec(self) -> dict[str, str]:
        """What the embedded default's warm start learns from besides its settings (``rlgrad.models.warmstart_key``):
        the training rows, so that a cached or shipped warm start on other data is never taken for this one."""
        rows = [(e.prompt, e.answer, e.messages) for e in self._train]
        return {"train_rows": hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]}

    def sft_target(self, example: Example) -> str:
        return f"First, work through the problem step by step. The answer is \\boxed{{{example.answer}}}."
