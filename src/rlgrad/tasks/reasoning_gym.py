"""Prompts and verifiers from a procedural dataset of the reasoning-gym library (optional extra).

``data.task=reasoning_gym data.reasoning_gym.dataset=chain_sum`` (or basic_arithmetic, countdown,
gsm_symbolic, ... any name in ``reasoning_gym.factory.DATASETS``); ``data.reasoning_gym.config`` holds the
dataset's own generator options (the keywords of ``reasoning_gym.create_dataset``), except ``seed``, which
rlgrad derives from ``trainer.seed``. Needs ``pip install 'rlgrad[reasoning]'``.

Prompt: the entry's ``question``, unchanged. It usually asks for a bare answer ("State the final answer ...");
reasoning-gym's own training recipes instead put a system prompt before it asking for ``<answer>...</answer>``
tags (``data.system_prompt``, with a chat-template model). Both are accepted:

* **answer extraction** (``reward.answer_extraction``, ``rlgrad.tasks.extraction``): the content of the last
  ``<answer>...</answer>`` pair (reasoning-gym's ``utils.extract_answer``) or a response that is nothing but
  the answer is the asked form (``strict``); otherwise ``auto`` (the default) falls back to the ``flexible``
  reading, verl's GSM8K one: the last number for a numeric reference answer, the last ``k`` lines otherwise
  (``k``: the reference's line count; grid answers such as sudoku span several lines);
* ``correctness``: the dataset's own verifier on the *extracted* answer, ``dataset.score_answer(answer, entry)``
  (never on a whole sentence): 1 when it gives 1.0, else 0. With ``reward.partial_credit=true`` the verifier's
  value in [0, 1] passes through instead: several verifiers pay partial credit (the arithmetic ones such as
  chain_sum and basic_arithmetic pay ``len(gold)/len(answer)`` when the gold answer is a substring, so ``17``
  for ``7`` earns 0.5; countdown pays 0.05 for a wrong expression); a response counts as correct only at 1.0;
* ``format``: 1 when the response has the asked form (the strict reading succeeds), 0 otherwise.

Data. Training prompts come from one dataset of ``size`` entries (``data.reasoning_gym.config.size``, default
``DEFAULT_POOL_SIZE``), created once; ``train_examples`` draws its indices with the ``rng`` it is handed, so
the stream is endless (drawn with replacement) and reproducible. The validation set is the first ``val_size``
distinct questions of a second dataset. The two dataset seeds come from ``trainer.seed`` (hashed, so nearby
seeds give unrelated data) and lie ``2**30`` apart: most generators seed entry ``i`` with ``seed + i``, so the
two index ranges can never produce the same entry; and training draws whose question is a validation question
are redrawn, as in the other generated tasks, so train and validation never share a question. Entries are
generated on access, except by a few datasets that build all of them up front (acre: lower ``size``) or cap it
(word_ladder: ``size`` <= 20000).

Caveats: entries whose dataset has no single reference answer (``answer`` is None: graph_color,
propositional_logic, rubiks_cube, ...) are scored by the verifier only and have an empty ``sft_target``. Some
reasoning-gym verifiers pass the model's answer to Python's ``eval`` or sympy's ``parse_expr`` (countdown,
puzzle24, n_queens, binary_matrix, spiral_matrix, string_insertion, the integration and polynomial datasets):
model output is then executed; only train a model you trust on those datasets.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import random
import re
from collections.abc import Mapping
from typing import Any

from rlgrad.errors import UserError
from rlgrad.tasks.base import Example, Score, make_score, resolve_weights, response_length
from rlgrad.tasks.extraction import Extraction, bare_answer, extract

DEFAULT_WEIGHTS = {"correctness": 0.9, "format": 0.1}
DEFAULT_POOL_SIZE = 100_000  # entries of the training dataset (data.reasoning_gym.config.size)
TRAIN_SEED_OFFSET = 2**30  # training seed - validation seed; keeps seed+index ranges apart
INSTALL_HINT = "pip install 'rlgrad[reasoning]'"
_TAGGED = re.compile(r"<answer>.*?</answer>", re.DOTALL)


def _import_reasoning_gym():
    try:
        import reasoning_gym
        import reasoning_gym.factory
    except ImportError:
        raise UserError(f"task 'reasoning_gym' needs the reasoning-gym package: {INSTALL_HINT}") from None
    return reasoning_gym


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def dataset_seeds(seed: int) -> tuple[int, int]:
    """(training, validation) dataset seeds for ``trainer.seed``: both below 2**31, ``TRAIN_SEED_OFFSET`` apart."""
    h = int.from_bytes(hashlib.sha256(f"rlgrad/reasoning_gym/{seed}".encode()).digest()[:4], "big")
    val = h % TRAIN_SEED_OFFSET
    return val + TRAIN_SEED_OFFSET, val


def strict_answer(response: str, reference: str | None) -> str | None:
    """The answer in the asked form: inside the last ``<answer>...</answer>`` pair (empty tags give none), or the
    whole response when it is a bare answer (``extraction.bare_answer``)."""
    if _TAGGED.search(response):
        from reasoning_gym.utils import extract_answer as rg_extract

        return (rg_extract(response) or "").strip() or None
    return bare_answer(response, reference)


def extract_answer(response: str, reference: str | None, mode: str = "auto") -> Extraction:
    """The answer a response gives under ``reward.answer_extraction`` ``mode``; see the module docstring."""
    return extract(response, reference, mode, lambda text: strict_answer(text, reference))


class ReasoningGymTask:
    def __init__(self, dataset: str | None, config: Mapping[str, Any] | None = None, seed: int = 0,
                 val_size: int = 128, weights: dict[str, float] | None = None, length_unit: str = "chars",
                 answer_extraction: str = "auto", partial_credit: bool = False):
        if not dataset or not isinstance(dataset, str):
            raise UserError("task 'reasoning_gym' needs data.reasoning_gym.dataset, a reasoning-gym dataset name "
                            "(e.g. chain_sum, basic_arithmetic, countdown, gsm_symbolic)")
        rg = _import_reasoning_gym()
        self.weights = resolve_weights("reasoning_gym", DEFAULT_WEIGHTS, weights)
        self.length_unit = length_unit
        self.answer_extraction, self.partial_credit = answer_extraction, partial_credit
        self.dataset_name = dataset
        options = self._check_options(rg, dataset, config)
        pool_size = options.pop("size", DEFAULT_POOL_SIZE)
        # The warm-started default model is cached under the task name: one cache per dataset and options.
        self.name = f"reasoning_gym-{dataset}"
        if config:
            digest = hashlib.sha256(json.dumps(dict(config), sort_keys=True, default=str).encode()).hexdigest()
            self.name += f"-{digest[:8]}"
        train_seed, val_seed = dataset_seeds(seed)
        self._train = self._create(rg, dataset, train_seed, pool_size, options, "the training dataset")
        self._val: list[Example] = []
        if val_size:
            span = 10 * val_size + 100
            val_ds = self._create(rg, dataset, val_seed, span, options, "the validation dataset")
            seen: set[str] = set()
            for i in range(span):
                entry = val_ds[i]
                if entry["question"] not in seen:
                    seen.add(entry["question"])
                    self._val.append(self._example(entry, "val", i))
                    if len(self._val) == val_size:
                        break
            else:
                raise UserError(f"task 'reasoning_gym': dataset '{dataset}' gave only {len(self._val)} distinct "
                                f"validation questions in {span} draws; lower data.val_size")
        self._val_questions = {ex.prompt for ex in self._val}

    # ---- construction ------------------------------------------------------------------------

    @staticmethod
    def _check_options(rg, dataset: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
        known = rg.factory.DATASETS
        if dataset not in known:
            close = difflib.get_close_matches(dataset, sorted(known), n=3, cutoff=0.6)
            listing = "python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))'"
            hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(known)} datasets: {listing})"
            raise UserError(f"unknown reasoning-gym dataset '{dataset}'{hint}")
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise UserError(f"data.reasoning_gym.config must be a mapping of generator options, got {config!r}")
        options = dict(config)
        if "seed" in options:
            raise UserError("data.reasoning_gym.config.seed is not allowed: the dataset seeds come from trainer.seed")
        fields = [f.name for f in dataclasses.fields(known[dataset][1]) if f.name != "seed"]
        for key in options:
            if key not in fields:
                close = difflib.get_close_matches(str(key), fields, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else f" (options: {', '.join(fields)})"
                raise UserError(f"reasoning-gym dataset '{dataset}' has no option '{key}'{hint}")
        size = options.get("size", DEFAULT_POOL_SIZE)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise UserError(f"data.reasoning_gym.config.size (training dataset size) must be a positive integer, "
                            f"got {size!r}")
        return options

    @staticmethod
    def _create(rg, dataset: str, seed: int, size: int, options: dict[str, Any], what: str):
        try:
            return rg.create_dataset(dataset, seed=seed, size=size, **options)
        except Exception as e:  # the library's own validation: AssertionError, ValueError, TypeError, ...
            shown = ", ".join(f"{k}={v!r}" for k, v in {**options, "size": size}.items())
            hint = ("" if what != "the training dataset" else
                    f"; its size is data.reasoning_gym.config.size (default {DEFAULT_POOL_SIZE})")
            raise UserError(f"reasoning-gym dataset '{dataset}' rejected the options of {what} ({shown}): "
                            f"{_one_line(e)}{hint}") from None

    def _example(self, entry: dict[str, Any], split: str, index: int) -> Example:
        answer = entry.get("answer")
        return Example(prompt=str(entry["question"]), answer="" if answer is None else str(answer),
                       meta={"dataset": self.dataset_name, "split": split, "index": index, "entry": entry})

    # ---- the Task protocol -------------------------------------------------------------------

    def train_examples(self, n: int, rng: random.Random) -> list[Example]:
        out = []
        for _ in range(n):
            for _ in range(1000):
                i = rng.randrange(len(self._train))
                entry = self._train[i]
                if entry["question"] not in self._val_questions:
                    out.append(self._example(entry, "train", i))
                    break
            else:
                raise UserError("task 'reasoning_gym': validation set covers almost every question; lower val_size")
        return out

    def val_examples(self) -> list[Example]:
        return list(self._val)

    def score(self, response: str, example: Example, num_tokens: int | None = None) -> Score:
        entry = example.meta["entry"]
        read = extract_answer(response, entry.get("answer"), self.answer_extraction)
        value = 0.0
        if read.answer is not None:
            try:
                value = float(self._train.score_answer(read.answer, entry))
            except Exception:  # a verifier choking on model output is a wrong answer, not a crashed run
                value = 0.0
        value = min(1.0, max(0.0, value)) if value == value else 0.0  # NaN -> 0
        if not self.partial_credit:
            value = float(value >= 1.0)
        components = {"correctness": value, "format": float(read.asked_form)}
        return make_score(components, self.weights, response_length(response, num_tokens, self.length_unit),
                          fallback=read.fallback)

    def sft_target(self, example: Example) -> str:
        """The bare reference answer, as the questions ask (empty for datasets without one)."""
        return example.answer
