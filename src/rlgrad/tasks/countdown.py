"""Countdown: combine the given numbers with + - * / to hit a target.

Prompt ``"3 7 25 -> 46:"``, response an expression such as ``"25+3*7"`` (the asked form, ``format``); under
``reward.answer_extraction=auto|flexible`` an expression inside a sentence (``25+3*7 = 46``) is read too.
Responses are model output, so they are parsed by a tiny recursive-descent
parser over exact fractions; nothing is ever handed to Python's ``eval``.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction

from rlgrad.tasks.base import (
    Example,
    Score,
    make_score,
    make_val_set,
    resolve_weights,
    response_length,
    sample_excluding,
)
from rlgrad.tasks.extraction import extract

DEFAULT_WEIGHTS = {"correctness": 0.9, "format": 0.1}
NUM_RANGE = (1, 25)
COUNT_MIX = {3: 0.5, 4: 0.5}  # how many numbers a prompt has -> probability
MAX_TARGET = 100  # keeps targets in the usual Countdown range instead of products like 25*24*23
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3  # precedence of a bare number or parenthesised group


# ---- parsing ---------------------------------------------------------------------------------

class _Syntax(Exception):
    pass


def _tokenize(s: str) -> list[str]:
    tokens, i = [], 0
    while i < len(s):
        c = s[i]
        if c == " ":
            i += 1
        elif c in "+-*/()":
            tokens.append(c)
            i += 1
        elif "0" <= c <= "9":
            j = i
            while j < len(s) and "0" <= s[j] <= "9":
                j += 1
            tokens.append(s[i:j])
            i = j
        else:
            raise _Syntax(f"bad character {c!r}")
    return tokens


class _Parser:
    """Grammar (usual precedence, left-associative)::

        expr   := term (('+' | '-') term)*
        term   := factor (('*' | '/') factor)*
        factor := '-' factor | '(' expr ')' | integer

    Builds a tree of tuples: ``("num", n)``, ``("neg", x)`` or ``(op, left, right)``.
    """

    def __init__(self, tokens: list[str]):
        self.tokens, self.i = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise _Syntax("unexpected end")
        self.i += 1
        return tok

    def expr(self) -> tuple:
        node = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = (op, node, self.term())
        return node

    def term(self) -> tuple:
        node = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            node = (op, node, self.factor())
        return node

    def factor(self) -> tuple:
        tok = self.take()
        if tok == "-":
            return ("neg", self.factor())
        if tok == "(":
            node = self.expr()
            if self.take() != ")":
                raise _Syntax("expected ')'")
            return node
        if tok.isdigit():
            return ("num", int(tok))
        raise _Syntax(f"unexpected {tok!r}")


def parse_expression(s: str) -> tuple | None:
    """Syntax tree of ``s``, or None if it is not a well-formed expression."""
    try:
        tokens = _tokenize(s)
        parser = _Parser(tokens)
        tree = parser.expr()
        if parser.peek() is not None:
            return None
        return tree
    except (_Syntax, RecursionError):
        return None


_EXPRESSION_RUN = re.compile(r"[0-9+\-*/() ]+")


def strict_expression(response: str) -> str | None:
    """The asked form: the whole response is one expression."""
    text = response.strip()
    return text if parse_expression(text) is not None else None


def flexible_expression(response: str) -> str | None:
    """The last run of expression characters in the text that parses, preferring one with an operator: the left
    side of ``25+3*7 = 46`` rather than the ``46``."""
    runs = [run.strip() for run in _EXPRESSION_RUN.findall(response)]
    parsed = [run for run in runs if run and parse_expression(run) is not None]
    with_op = [run for run in parsed if any(op in run for op in "+-*/")]
    return (with_op or parsed or [None])[-1]


def _eval(node: tuple) -> Fraction:
    kind = node[0]
    if kind == "num":
        return Fraction(node[1])
    if kind == "neg":
        return -_eval(node[1])
    a, b = _eval(node[1]), _eval(node[2])
    if kind == "+":
        return a + b
    if kind == "-":
        return a - b
    if kind == "*":
        return a * b
    return a / b  # ZeroDivisionError is caught by the caller


def _numbers(node: tuple) -> list[int]:
    if node[0] == "num":
        return [node[1]]
    return [n for child in node[1:] for n in _numbers(child)]


def evaluate_expression(s: str | tuple) -> tuple[Fraction, list[int]] | None:
    """(exact value, numbers used) of an expression string or parsed tree; None for junk or division by zero."""
    tree = parse_expression(s) if isinstance(s, str) else s
    if tree is None:
        return None
    try:
        return _eval(tree), _numbers(tree)
    except (ZeroDivisionError, RecursionError):
        return None


# ---- generation ------------------------------------------------------------------------------

def _build(nums: list[int], rng: random.Random) -> tuple[int, str, int] | None:
    """Random expression tree over ``nums`` in order: (value, text, precedence), or None if some
    intermediate value is not a positive integer."""
    if len(nums) == 1:
        return nums[0], str(nums[0]), _ATOM
    k = rng.randint(1, len(nums) - 1)
    left, right = _build(nums[:k], rng), _build(nums[k:], rng)
    if left is None or right is None:
        return None
    (a, ta, pa), (b, tb, pb) = left, right
    op = rng.choice("+-*/")
    if op == "+":
        value = a + b
    elif op == "-":
        value = a - b
    elif op == "*":
        value = a * b
    else:
        value = a // b if a % b == 0 else 0
    if value <= 0:
        return None
    p = _PREC[op]
    ta = f"({ta})" if pa < p else ta
    # a-(b-c) and a/(b/c) need the parentheses; a*(b/c) == a*b/c exactly, so it does not.
    tb = f"({tb})" if pb < p or (pb == p and op in "-/") else tb
    return value, f"{ta}{op}{tb}", p


def draw_example(rng: random.Random) -> Example:
    count = rng.choices(list(COUNT_MIX), weights=list(COUNT_MIX.values()))[0]
    while True:  # roughly one random tree in five is kept, so this ends quickly
        nums = [rng.randint(*NUM_RANGE) for _ in range(count)]
        built = _build(nums, rng)
        if built is not None and built[0] <= MAX_TARGET:
            break
    target, solution, _ = built
    shown = sorted(nums)  # the prompt must not leak the solution's operand order
    prompt = " ".join(map(str, shown)) + f" -> {target}:"
    return Example(prompt=prompt, answer=str(target),
                   meta={"numbers": shown, "target": target, "solution": solution})


class CountdownTask:
    name = "countdown"

    def __init__(self, seed: int = 0, val_size: int = 128, weights: dict[str, float] | None = None,
                 length_unit: str = "chars", answer_extraction: str = "auto"):
        self.weights = resolve_weights(self.name, DEFAULT_WEIGHTS, weights)
        self.length_unit, self.answer_extraction = length_unit, answer_extraction
        self._val = make_val_set(draw_example, seed, val_size, self.name)
        self._val_prompts = {ex.prompt for ex in self._val}

    def train_examples(self, n: int, rng: random.Random) -> list[Example]:
        return sample_excluding(draw_example, rng, n, self._val_prompts, self.name)

    def val_examples(self) -> list[Example]:
        return list(self._val)

    def score(self, response: str, example: Example, num_tokens: int | None = None) -> Score:
        read = extract(response, None, self.answer_extraction, strict_expression, flexible_expression)
        tree = parse_expression(read.answer) if read.answer is not None else None
        result = evaluate_expression(tree) if tree is not None else None
        correct = (result is not None and result[0] == example.meta["target"]
                   and sorted(result[1]) == sorted(example.meta["numbers"]))
        components = {"correctness": float(correct), "format": float(read.asked_form)}
        return make_score(components, self.weights, response_length(response, num_tokens, self.length_unit),
                          fallback=read.fallback)

    def sft_target(self, example: Example) -> str:
        return example.meta["solution"]
