"""What is alive at the peak of the wider embedded model's actor update, plain and with the task-term instruments
riding on it (``wider_parts.py``'s ``plain`` and ``ride`` parts, on one rolled-out batch): every tensor storage that
an operator allocated (a ``TorchDispatchMode`` sees each operator's outputs; a storage's end is read from its weak
reference), counted at the moment their sum is largest, grouped by the source lines in rlgrad and transformers that
allocated it; then what the riding update holds at its peak that the plain one does not.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/results/i49/memory_wider/alive_at_peak.py [--contiguous-head]

``--contiguous-head``: a trial of a fix, both sides alike: a forward pre-hook on the LM head hands it a contiguous
copy of its input (the final norm's output at the response columns, a strided view of all columns), so that the
input the engine's forward hook holds until the head's output gradient (riding) is the tensor autograd saves, not a
view keeping the whole norm output alive (a trial of where the memory goes; the update's numbers are not compared).

Storages that no operator allocated (the parameters, the optimizer's states, the batch) are outside the count: the
two updates share them. The count is of bytes allocated by operators, not the resident set ``peak_mb`` reads.
"""

from __future__ import annotations

import sys
import traceback
from collections import defaultdict
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wider_parts import Parts  # noqa: E402


def _where() -> str:
    """The innermost three frames in rlgrad or transformers that led to the allocation."""
    frames = [f for f in traceback.extract_stack()[:-3] if "/rlgrad/" in f.filename or "/transformers/" in f.filename]
    return " < ".join(f"{f.filename.split('/src/')[-1].split('site-packages/')[-1]}:{f.lineno}" for f in
                      reversed(frames[-3:]))


class AliveAtPeak(TorchDispatchMode):
    """Each operator-allocated storage (bytes, where) while alive; the set alive at the largest total."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int, str]] = {}
        self.total = self.peak = 0
        self.at_peak: dict[str, int] = {}
        self.peak_op = ""  # the operator whose outputs made the largest total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key in [k for k, (ref, _, _) in self.live.items() if ref.expired()]:
            self.total -= self.live.pop(key)[1]
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            st = t.untyped_storage()
            if st.data_ptr() in self.live or st.nbytes() == 0:
                continue
            self.live[st.data_ptr()] = (StorageWeakRef(st), st.nbytes(), f"{func.__name__} @ {_where()}")
            self.total += st.nbytes()
        if self.total > self.peak:
            self.peak, by = self.total, defaultdict(int)
            for _, n, where in self.live.values():
                by[where] += n
            self.at_peak, self.peak_op = dict(by), f"{func.__name__} @ {_where()}"
        return out


def main() -> None:
    torch.set_num_threads(1)
    run = Parts()
    if "--contiguous-head" in sys.argv:
        head = run.tr.train_actor.get_output_embeddings()
        head.register_forward_pre_hook(lambda m, args: (args[0].contiguous(), *args[1:]))
        print("trial: the LM head's input made contiguous (a forward pre-hook)")
    run.plain()
    run.ride()  # warm-ups
    run.after()
    peaks = {}
    for part in ("plain", "ride"):
        mode = AliveAtPeak()
        with mode:
            getattr(run, part)()
        if part == "ride":
            run.after()
        peaks[part] = mode
        print(f"{part}: operator-allocated storages alive at the peak {mode.peak / 2 ** 20:.1f} MB "
              f"(batch {run.shapes[-1]}), reached at {mode.peak_op}")
    plain, ride = peaks["plain"].at_peak, peaks["ride"].at_peak
    diff = {w: ride.get(w, 0) - plain.get(w, 0) for w in set(plain) | set(ride)}
    print(f"ride - plain at their peaks: {sum(diff.values()) / 2 ** 20:+.2f} MB; by where it was allocated "
          "(|difference| >= 0.05 MB):")
    for where, n in sorted(diff.items(), key=lambda kv: -abs(kv[1])):
        if abs(n) >= 0.05 * 2 ** 20:
            print(f"  {n / 2 ** 20:+8.2f} MB  {where}")


if __name__ == "__main__":
    main()
