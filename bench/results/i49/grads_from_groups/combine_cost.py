"""Overlapping slices of one Linear (S = 2, one thread): the rows' own gradients combined, a chunk of rows at a time
(engine._combined_rows), against one product per slice (engine._disjoint_slices), beside the one product of the
batch's weight gradient; at the embedded default's shapes (128 rows of 9 tokens) and SmolLM2's (32 rows of 92).
Output: combine_cost.txt beside it.

    OMP_NUM_THREADS=1 .venv/bin/python bench/results/i49/grads_from_groups/combine_cost.py
"""

import time

import torch

CHUNK_ELEMENTS = 1 << 21  # engine.ROW_CHUNK_ELEMENTS


def combined(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    step = max(1, CHUNK_ELEMENTS // (g.shape[-1] * x.shape[-1]))
    out = None
    for a in range(0, len(g), step):
        per_row = torch.bmm(g[a:a + step].transpose(1, 2), x[a:a + step]).flatten(1)
        out = w[:, a:a + step] @ per_row if out is None else out.addmm_(w[:, a:a + step], per_row)
    return out


def by_slice(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    flat_x = x.flatten(0, 1)
    return torch.stack([(g * ws.view(-1, 1, 1)).flatten(0, 1).t() @ flat_x for ws in w])


def one_product(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return g.flatten(0, 1).t() @ x.flatten(0, 1)


def main() -> None:
    torch.set_num_threads(1)
    for rows, tokens, fan_in, fan_out in [(128, 9, 128, 128), (128, 9, 128, 384), (32, 92, 576, 1536)]:
        g, x, w = torch.randn(rows, tokens, fan_out), torch.randn(rows, tokens, fan_in), torch.randn(2, rows)
        for way in (combined, by_slice, one_product):
            way(g, x, w)
            started = time.perf_counter()
            for _ in range(20):
                way(g, x, w)
            ms = (time.perf_counter() - started) / 20 * 1e3
            print(f"{rows} rows x {tokens} tokens, {fan_in} -> {fan_out}: {way.__name__} {ms:.2f} ms")


if __name__ == "__main__":
    main()
