"""The runs of this directory (base and after) and of mid/ (base and mid) side by side: each bench/always_on_cost.py
--paired-batch run's by-pairs figure (its median pair and 95% interval, as printed), its instruments' timers summed,
and for each setting the difference after (mid) - base at the same pair index over all rounds (a pair's two steps
train on one batch, and the runs draw the same batches in the same order while their weights agree: README.md), its
median with a 95% bootstrap interval over those pairs (2,000 draws, seed 0). Output: paired.txt beside it.

    .venv/bin/python bench/results/i49/session8/paired.py > bench/results/i49/session8/paired.txt
"""

import random
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[2]))  # bench/
from always_on_cost import median_interval  # noqa: E402

SETTINGS = ("task", "task60", "always_on")


def by_pairs(text: str) -> tuple[str, list[float]]:
    found = re.search(r"by pairs: (median [0-9.]+ \[[0-9.]+, [0-9.]+\]) over \d+ pairs \(all: ([^)]*)\)", text)
    return found[1], [float(x) for x in found[2].split(",")]


def timers_ms(text: str) -> float:
    return 1e3 * sum(float(x) for x in re.findall(r"timing_s/(?:analysis|neuron)/\S+: median ([0-9.]+) s", text))


def main() -> None:
    rng = random.Random(0)
    for where, other in ((HERE / "mid", "mid"), (HERE, "after")):
        for setting in SETTINGS:
            _compare(rng, where, setting, other)


def _compare(rng: random.Random, where: Path, setting: str, other: str, root: Path = HERE, base: str = "base"
             ) -> None:
    """``where``'s runs of ``setting`` (names relative to ``root``) and ``other`` - ``base`` at the same pair index."""
    runs = {side: {path.stem.split("_r")[-1]: path for path in sorted(where.glob(f"{setting}_{side}_r*.txt"))}
            for side in (base, other)}
    for side in runs.values():
        for path in side.values():
            text = path.read_text()
            src = re.search(r"src=(\w+)", text)[1]
            print(f"{path.relative_to(root)}: {src}, 1 + instruments / plain update by pairs {by_pairs(text)[0]}; "
                  f"instrument timers {timers_ms(text):.0f} ms")
    rounds = sorted(set(runs[base]) & set(runs[other]))  # a round: base and the other back to back
    diffs = [a - b for r in rounds
             for a, b in zip(by_pairs(runs[other][r].read_text())[1], by_pairs(runs[base][r].read_text())[1])]
    if diffs:
        low, high = median_interval(diffs, rng)
        print(f"{where.relative_to(root).as_posix()} {setting}: {other} - {base} at the same pair index, median "
              f"{statistics.median(diffs):+.3f} [{low:+.3f}, {high:+.3f}] over {len(diffs)} pairs "
              f"(rounds {', '.join(rounds)})")


if __name__ == "__main__":
    main()
