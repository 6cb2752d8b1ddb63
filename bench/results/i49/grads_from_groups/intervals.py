"""95% bootstrap intervals of a bench/always_on_cost.py run's step ratios, from its stored raw output: the unit is
one pair of steps (instrumented and plain, interleaved in one process); the median pair's ratio and the total time
ratio, each resampled over the pairs 2,000 times (seed 0). Output: intervals.txt beside it.

    .venv/bin/python bench/results/i49/grads_from_groups/intervals.py \\
        bench/results/i49/smollm2/*grads_from_groups*.txt bench/results/i49/grads_from_groups/always_on_*.txt
"""

import random
import re
import statistics
import sys
from pathlib import Path

DRAWS = 2000


def steps(text: str, side: str) -> list[float]:
    found = re.search(rf"{side}: median .*?\(all: ([^)]*)\)", text)
    if found is None:
        raise SystemExit(f"no per-step times for '{side}' in the output")
    return [float(x) for x in found.group(1).split(",")]


def interval(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def main(paths: list[str]) -> None:
    rng = random.Random(0)
    for path in paths:
        text = Path(path).read_text()
        with_, plain = steps(text, "with"), steps(text, " without")
        pairs = list(zip(with_, plain))
        medians, totals = [], []
        for _ in range(DRAWS):
            drawn = rng.choices(pairs, k=len(pairs))
            medians.append(statistics.median(w / p for w, p in drawn))
            totals.append(sum(w for w, _ in drawn) / sum(p for _, p in drawn))
        median = statistics.median(w / p for w, p in pairs)
        total = sum(with_) / sum(plain)
        (m_lo, m_hi), (t_lo, t_hi) = interval(medians), interval(totals)
        print(f"{Path(path).name}: {len(pairs)} pairs; median pair {median:.2f} [{m_lo:.2f}, {m_hi:.2f}]; "
              f"total {total:.2f} [{t_lo:.2f}, {t_hi:.2f}]")


if __name__ == "__main__":
    main(sys.argv[1:])
