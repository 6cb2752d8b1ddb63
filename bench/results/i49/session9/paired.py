"""This directory's bench/always_on_cost.py --paired-batch runs side by side: c689e31 (base) and the basis's pieces
with the groups (after); the task-term instruments with the reward components (on) and without (off); batched.py
without (base) and with the Linears by shape (batched). Each run's by-pairs figure and instruments' timers, and per
setting the difference at the same pair index over all rounds, its median with a 95% bootstrap interval over those
pairs (session 8's paired.py, which says why pairs at one index are paired). Output: paired.txt beside it.

    .venv/bin/python bench/results/i49/session9/paired.py > bench/results/i49/session9/paired.txt
"""

import importlib.util
import random
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("session8_paired", HERE.parent / "session8" / "paired.py")
session8 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(session8)


def main() -> None:
    rng = random.Random(0)
    for setting in ("task60", "always_on"):
        session8._compare(rng, HERE, setting, "after", root=HERE)
    session8._compare(rng, HERE, "components", "on", root=HERE, base="off")  # the reward components' part
    session8._compare(rng, HERE, "deferred", "batched", root=HERE)  # batched.py's Linears by shape


if __name__ == "__main__":
    main()
