"""Answer extraction: which part of a response is the answer, and whether it came in the asked form.

``reward.answer_extraction`` (verl's GSM8K scorer has the same two readings, ``strict`` and ``flexible``):

* ``strict``: only an answer in the form the prompt asked for counts: inside ``<answer>...</answer>`` tags
  (reasoning-gym's recipes), inside ``\\boxed{}`` (math), or the whole response being nothing but the answer
  (a bare ``42``). Anything else extracts nothing and scores 0.
* ``flexible``: the last number of the response for a numeric reference (verl's GSM8K ``flexible``: the last
  match of ``-?[0-9.,]+`` that is not ``.``), the last line otherwise. rlgrad then drops thousands commas and
  a sentence's closing period (``is 4.`` reads ``4``), which verl compares as written (``4.`` is wrong there).
* ``auto`` (the default): strict when the response has the asked form, flexible otherwise.

The **format** component is always the strict reading's success: 1 only when the response has the asked
form, whatever mode scores correctness. The share of responses scored through the flexible fallback is
logged as ``reward/extraction/flexible_share``, so a run whose model never follows the format shows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EXTRACTION_MODES = ("auto", "strict", "flexible")
_NUMBER_RUN = re.compile(r"-?[0-9.,]+")  # verl's gsm8k flexible pattern
_NUMBER = re.compile(r"-?(\d+(\.\d*)?|\.\d+)")


@dataclass(frozen=True)
class Extraction:
    """``answer``: the text scored (None: nothing to score); ``asked_form``: the response has the form the prompt
    asked for (the format reward); ``fallback``: the answer came from the flexible reading in ``auto`` mode."""

    answer: str | None
    asked_form: bool
    fallback: bool = False


def is_numeric(reference: str | None) -> bool:
    """A reference answer that is one number (``42``, ``-3``, ``0.5``, ``1,000``)."""
    return reference is not None and _NUMBER.fullmatch(str(reference).strip().replace(",", "")) is not None


def clean_number(text: str) -> str:
    """A number as written in prose, as the verifier compares it: no thousands commas, no closing period."""
    text = text.replace(",", "")
    return text[:-1] if text.endswith(".") and len(text) > 1 else text


def last_number(response: str) -> str | None:
    """verl's GSM8K ``flexible`` reading (the last number-like run that is not ``.``), cleaned by ``clean_number``;
    None when the response has no digit."""
    for run in reversed(_NUMBER_RUN.findall(response)):
        cleaned = clean_number(run.strip(","))
        if _NUMBER.fullmatch(cleaned):
            return cleaned
    return None


def flexible_answer(response: str, reference: str | None) -> str | None:
    """The flexible reading: the last number for a numeric reference, else the last ``k`` non-blank lines, ``k``
    the reference's line count (grid answers span several lines)."""
    if is_numeric(reference):
        return last_number(response)
    k = max(1, len(str(reference or "").strip().splitlines()))
    lines = [line for line in response.strip().splitlines() if line.strip()]
    return "\n".join(lines[-k:]).strip() or None


def bare_answer(response: str, reference: str | None) -> str | None:
    """The response when it is nothing but an answer: one number (a closing period allowed) for a numeric
    reference, else at most ``k`` non-blank lines without an answer tag; None otherwise."""
    text = response.strip()
    if not text or "<answer" in text:
        return None
    if is_numeric(reference):
        cleaned = clean_number(text)
        return cleaned if _NUMBER.fullmatch(cleaned) else None
    k = max(1, len(str(reference or "").strip().splitlines()))
    return text if sum(bool(line.strip()) for line in text.splitlines()) <= k else None


def extract(response: str, reference: str | None, mode: str, strict_reader, flexible_reader=None) -> Extraction:
    """Read ``response`` under ``mode``. ``strict_reader(response)``: the task's strict reading (the answer in the
    asked form, or None); ``flexible_reader(response)``: its flexible one (default ``flexible_answer``)."""
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"answer extraction must be one of {', '.join(EXTRACTION_MODES)}, got {mode!r}")
    strict = strict_reader(response)
    asked = strict is not None
    if mode == "strict" or (mode == "auto" and asked):
        return Extraction(strict, asked)
    answer = flexible_reader(response) if flexible_reader else flexible_answer(response, reference)
    return Extraction(answer, asked, fallback=not asked)
