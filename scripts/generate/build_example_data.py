"""Build examples/data/tiny_arith.parquet: a small data set in verl's layout, sample data for examples/custom_reward.py
(``data.task=math data.train_files=[examples/data/tiny_arith.parquet]``; no preset trains on it since 2026-11-29:
docs/instruments.md#your-own-reward-function-verls-custom_reward_function says why).

    python scripts/generate/build_example_data.py

120 rows of one-digit additions and subtractions ("What is 7 plus 8?", "What is 9 minus 4?"), in verl's parquet
layout (the columns examples/data_preprocess/gsm8k.py of verl writes): ``data_source``, ``prompt`` (chat
messages), ``ability``, ``reward_model`` ({style, ground_truth}) and ``extra_info`` ({split, index, operation}).
Deterministic: a rebuild writes the same rows (tests/tasks/test_custom_reward.py checks the shipped file against
``rows()``).
"""

from __future__ import annotations

import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "examples" / "data" / "tiny_arith.parquet"
OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b}
ROWS = 120


def rows() -> list[dict]:
    rng = random.Random(35)
    pairs = sorted({(a, op, b) for a in range(1, 10) for b in range(1, 10) for op in OPS
                    if op != "minus" or a >= b})
    picked = rng.sample(pairs, ROWS)
    return [{"data_source": "rlgrad/tiny_arith",
             "prompt": [{"role": "user", "content": f"What is {a} {op} {b}?"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(OPS[op](a, b))},
             "extra_info": {"split": "train", "index": i, "operation": op}}
            for i, (a, op, b) in enumerate(picked)]


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    OUT.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows()), OUT)
    print(f"wrote {ROWS} rows to {OUT}")


if __name__ == "__main__":
    main()
