"""Your own reward function, as verl takes it (``reward.custom_reward_function.path`` / ``.name``, verl's keys).

The function scores the responses of any task with a ground truth (arithmetic, countdown, math, reasoning_gym)
and is called as verl 0.9's reward managers call it, by keyword, once per response::

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)

``data_source``, ``ground_truth`` and ``extra_info`` are what a verl data file holds for the row (``verl_inputs``):
the ``data_source`` column, ``reward_model.ground_truth`` as stored and the ``extra_info`` column (``{}`` when
absent), to which verl adds ``num_turns`` (2: one prompt, one response) and ``rollout_reward_scores`` (``{}``).
Each call gets its own copy of ``extra_info``.

A number is the reward. A dict's ``score`` is the reward; its other numeric fields (bools count, strings and
the like are passed over, as verl only logs them) are reward components, logged as a task's components are and
split by the reward-component geometry. A field's weight is 0 unless ``reward.weights`` gives it one, and one
more component, ``rest`` (weight 1), is ``score`` less the weighted fields, so the components always add up to
the reward: with weights that rebuild ``score`` from its parts, ``rest`` is 0 and the geometry splits the update
among the parts. ``correct`` (``val/accuracy``, the ``acc`` of ``algorithm.filter_groups``) is the dict's ``acc``
field when it has one (verl's name; 1 is correct), else the task's own verdict.

Before training, the function scores the task's reference answer (``sft_target``) of the first validation row:
that call fixes the dict's numeric fields (every later return must carry the same ones) and puts a wrong
signature or return in front of the user before anything is written. Errors are one line naming the file and
the function; an exception inside the function stops the run with its own traceback and the row it scored.
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import random
import reprlib
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgrad.errors import UserError
from rlgrad.metrics import component_keys
from rlgrad.tasks.base import Example, Score, Task, data_rows

VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
REST = "rest"  # score less the weighted fields
SHAPING = ("overlong", "kl_penalty")  # the trainer's own components (rl/shaping.py): no field takes their key
SETTING = "reward.custom_reward_function"
NUM_TURNS = 2  # verl's single-turn agent loop: a prompt and a response


class RewardFunctionError(UserError):
    """The user's reward function raised: the message carries its traceback (the frames of their code)."""


def _short(x: Any, limit: int = 80) -> str:
    """``x`` as a one-line, bounded repr."""
    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxdict, r.maxlist = limit, limit, 6, 6
    return r.repr(x).replace("\n", "\\n")


def _their_traceback(e: BaseException, file: str | None) -> str:
    """The traceback of ``e`` from the first frame in ``file`` (the user's code) on; every frame below ours
    when none is (e.g. a builtin raised at the call)."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = [i for i, f in enumerate(frames) if file and Path(f.filename).resolve() == Path(file).resolve()]
    frames = frames[mine[0]:] if mine else frames[1:]
    text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(e), e))
    return "Traceback (most recent call last):\n" + text.rstrip("\n")


# ---- loading -------------------------------------------------------------------------------------

def _import_file(path: str, fn_name: str) -> Any:
    """The module of a ``.py`` file (registered in ``sys.modules`` under a name of its own, as dataclasses and
    pickle need); ``fn_name``: the function wanted from it, for the errors."""
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise UserError(f"{SETTING}.path: {path}, the file of the reward function {fn_name}, {what}")
    name = "rlgrad_reward_" + hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise UserError(f"{SETTING}.path: {path}, the file of the reward function {fn_name}, is not a Python "
                        "file (.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise UserError(f"{SETTING}.path: {path}:{e.lineno}: {e.msg} (the file of the reward function "
                        f"{fn_name})") from None
    except Exception as e:
        sys.modules.pop(name, None)
        raise RewardFunctionError(f"{SETTING}.path: importing {path} raised {type(e).__name__}; its "
                                  f"traceback:\n{_their_traceback(e, str(p))}") from e
    return module


def _import(path: str, fn_name: str) -> Any:
    """verl's ``load_module``: ``pkg://a.b`` (or ``pkg://a/b``) imports a module, ``file://x.py`` or a plain path
    reads a file."""
    if path.startswith("pkg://"):
        name = path[len("pkg://"):].replace("/", ".")
        try:
            return importlib.import_module(name)
        except ImportError as e:
            raise UserError(f"{SETTING}.path: cannot import {name}, the module of the reward function {fn_name} "
                            f"({e})") from None
    return _import_file(path.removeprefix("file://"), fn_name)


def _check_signature(fn: Callable, label: str, kwargs: Mapping[str, Any]) -> None:
    """verl calls by keyword with the four arguments and reward_kwargs: the function must take them."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the call will tell
        return
    try:
        sig.bind(**{**dict.fromkeys(VERL_ARGS), **kwargs})
    except TypeError as e:
        extra = "".join(f", {k}=" for k in kwargs if k not in VERL_ARGS)
        raise UserError(f"{label} cannot be called as verl calls it, with (data_source=, solution_str=, "
                        f"ground_truth=, extra_info={extra}): {e}; its signature is {sig}") from None


@dataclass
class RewardFunction:
    """The user's function, loaded and checked; ``call`` runs it as verl does."""

    fn: Callable
    path: str
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    file: str | None = None  # the module's file: where the traceback of an exception starts

    @property
    def label(self) -> str:
        return f"reward function {self.name} ({self.path})"

    def call(self, where: str, response: str, **inputs: Any) -> Any:
        """The function's return for one response; ``where`` names the row in an error."""
        try:
            result = self.fn(**{**inputs, "solution_str": response, **self.kwargs})
            if inspect.isawaitable(result):  # verl awaits an async reward function
                result = asyncio.run(_awaited(result))
        except Exception as e:
            raise RewardFunctionError(f"{self.label} raised {type(e).__name__} for {where}, response "
                                      f"{_short(response)}; its traceback:\n{_their_traceback(e, self.file)}") from e
        return result


async def _awaited(result: Any) -> Any:
    return await result


def load_reward_function(path: str, name: str = "compute_score", kwargs: Mapping[str, Any] | None = None
                         ) -> RewardFunction:
    """The function ``name`` of ``path`` (a file, ``file://``, or ``pkg://module``), checked against verl's call."""
    module = _import(str(path), name)
    label = f"reward function {name} ({path})"
    fn = getattr(module, name, None)
    if fn is None:
        names = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
        hint = difflib.get_close_matches(name, names, n=1)
        more = f"; did you mean '{hint[0]}'?" if hint else f" (its functions: {', '.join(names) or 'none'})"
        raise UserError(f"{SETTING}.name: {path} has no function '{name}'{more}")
    if not callable(fn):
        raise UserError(f"{SETTING}.name: '{name}' in {path} is a {type(fn).__name__}, not a function")
    kwargs = dict(kwargs or {})
    _check_signature(fn, label, kwargs)
    return RewardFunction(fn, str(path), name, kwargs, getattr(module, "__file__", None))


# ---- what verl passes ----------------------------------------------------------------------------

def verl_inputs(task: str, example: Example) -> dict[str, Any]:
    """``data_source``, ``ground_truth`` and ``extra_info`` of ``example`` as a verl data file would hold them.

    math: the row's ``data_source`` (``"math"`` when it has none), its ground truth (verl rows: as stored) and
    ``extra_info``; countdown: ``"countdown"`` and TinyZero's ``{"target", "numbers"}``; reasoning_gym: the
    dataset's name, its answer and ``{"split", "index", "entry"}`` (the entry its verifier scores with);
    arithmetic: ``"arithmetic"``, the answer and the example's ``{"difficulty"}``.
    """
    meta = example.meta or {}
    if "verl" in meta:  # a data file's row (math)
        v = meta["verl"]
        source, truth, extra = v["data_source"] or task, v["ground_truth"], v["extra_info"]
    elif task == "countdown":
        source, truth, extra = task, {"target": meta["target"], "numbers": list(meta["numbers"])}, {}
    elif "entry" in meta:  # reasoning_gym (the task's name is reasoning_gym-<dataset>)
        entry = meta["entry"]
        source, truth = meta["dataset"], entry.get("answer")
        extra = {"split": meta["split"], "index": meta["index"], "entry": entry}
    else:
        source, truth, extra = task, example.answer, dict(meta)
    extra = copy.deepcopy(extra) if extra is not None else {}
    if isinstance(extra, dict):  # what verl's reward manager adds
        extra.update(num_turns=NUM_TURNS, rollout_reward_scores={})
    return {"data_source": source, "ground_truth": copy.deepcopy(truth), "extra_info": extra}


def _number(x: Any) -> float | None:
    """``x`` as a float when it is a number (bool, int, float, a numpy scalar, a 0-d array or tensor)."""
    if isinstance(x, bool | numbers.Real):
        return float(x)
    if getattr(x, "shape", None) == () and hasattr(x, "item"):
        v = x.item()
        return float(v) if isinstance(v, bool | numbers.Real) else None
    return None


def read_result(result: Any, label: str, where: str) -> tuple[float, dict[str, float]]:
    """``(score, numeric fields)`` of a return, verl's way: a number, or a dict with ``score``."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise UserError(f"{label} returned a dict without 'score' for {where} (its keys: "
                            f"{', '.join(map(str, result)) or 'none'}); verl's reward is the dict's 'score'")
        score = _number(result["score"])
        if score is None:
            raise UserError(f"{label} returned a non-numeric 'score' for {where}: {_short(result['score'])} "
                            f"({type(result['score']).__name__})")
        fields = {str(k): n for k, v in result.items() if k != "score" and (n := _number(v)) is not None}
    else:
        score, fields = _number(result), {}
        if score is None:
            raise UserError(f"{label} returned {_short(result)} ({type(result).__name__}) for {where}; a reward "
                            "function returns a number or a dict with a numeric 'score'")
    bad = [(k, v) for k, v in {"score": score, **fields}.items() if not math.isfinite(v)]
    if bad:
        raise UserError(f"{label} returned {bad[0][0]}={bad[0][1]} for {where}; rewards must be finite")
    return score, fields


def _where(task: str, example: Example) -> str:
    """The row of ``example`` for an error: its file and row, or the generated prompt."""
    source = (example.meta or {}).get("source")
    return f"row {source}" if source else f"the {task} prompt {_short(example.prompt)}"


# ---- the task ------------------------------------------------------------------------------------

class CustomRewardTask:
    """``task``'s prompts, scored by the user's function (the module docstring)."""

    def __init__(self, task: Task, function: RewardFunction, weights: dict[str, float] | None = None):
        self.task, self.function = task, function
        self.name = task.name
        probe = (task.val_examples()[:1] or task.train_examples(1, random.Random(0)))[0]
        self.probe_where = f"the reference answer of {_where(self.name, probe)}"
        _, fields = read_result(self._call(task.sft_target(probe), probe), function.label, self.probe_where)
        self.fields = list(fields)
        # each field's component name: the metric-key form of it, never one of the trainer's components
        self.keys = dict(zip(self.fields, component_keys([REST, *SHAPING, *self.fields])[1 + len(SHAPING):]))
        self.weights = {**self._field_weights(weights or {}), REST: 1.0}

    def _field_weights(self, user: dict[str, float]) -> dict[str, float]:
        """Each field's weight: 0, or what ``reward.weights`` gives it."""
        out = dict.fromkeys(self.keys.values(), 0.0)
        for k, v in user.items():
            if k == REST:
                raise UserError(f"reward.weights: '{REST}' is the score less the weighted fields of "
                                f"{self.function.label}; its weight is 1")
            if k not in out:
                has = (f"its dict's numeric fields are {', '.join(out)}" if out
                       else "it returns no numeric field besides score")
                raise UserError(f"reward.weights: '{k}' is not a reward component of {self.function.label}; {has}")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise UserError(f"reward weight '{k}' must be a number, got {v!r}")
            out[k] = float(v)
        return out

    def _call(self, response: str, example: Example) -> Any:
        return self.function.call(_where(self.name, example), response, **verl_inputs(self.name, example))

    # ---- the Task protocol -----------------------------------------------------------------------

    def train_examples(self, n: int, rng: random.Random) -> list[Example]:
        return self.task.train_examples(n, rng)

    def val_examples(self) -> list[Example]:
        return self.task.val_examples()

    def data_examples(self) -> list[Example]:
        return data_rows(self.task)

    def sft_target(self, example: Example) -> str:
        return self.task.sft_target(example)

    def score(self, response: str, example: Example, num_tokens: int | None = None) -> Score:
        own = self.task.score(response, example, num_tokens)  # the task's verdict and length
        where = _where(self.name, example)
        total, fields = read_result(self._call(response, example), self.function.label, where)
        if set(fields) != set(self.fields):
            raise UserError(f"{self.function.label} returned the numeric fields {', '.join(fields) or 'none'} for "
                            f"{where} but {', '.join(self.fields) or 'none'} for {self.probe_where} (scored before "
                            "training); every return needs the same ones: they are the run's reward components")
        comps = {self.keys[f]: fields[f] for f in self.fields}
        weighted = math.fsum(self.weights[k] * v for k, v in comps.items())
        rest = total - weighted
        # weights that rebuild the score leave float rounding only: that is no component
        comps[REST] = 0.0 if abs(rest) <= 1e-9 * max(1.0, abs(total), abs(weighted)) else rest
        correct = fields["acc"] == 1.0 if "acc" in fields else own.correct
        return Score(total=total, components=comps, correct=correct, actual_length=own.actual_length)

    def __getattr__(self, name: str) -> Any:  # the rest of the task (warmstart_target, warmstart_spec, ...)
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)
