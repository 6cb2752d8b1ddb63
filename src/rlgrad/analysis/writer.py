"""A background writer of ``.npz`` arrays, so saving the component gradients never stalls a training step.
"""

from __future__ import annotations

import io
import queue
import sys
import threading
from pathlib import Path

import torch

from rlgrad.runfiles import atomic_write_bytes


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class BackgroundWriter:
    """Writes ``.npz`` files on a worker thread, so saving gradients never blocks training.

    ``submit`` only enqueues (tensors are moved to the CPU first, so the worker never touches the device).
    ``close`` writes whatever is queued and stops the thread. A failed write is reported at once (``log``)
    and kept in ``failures``; the writer goes on with the next file.
    """

    def __init__(self, log=_stderr):
        self.log = log
        self.failures: list[tuple[str, str]] = []
        self.written: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, path: str | Path, arrays: dict[str, torch.Tensor]) -> None:
        cpu = {k: v.detach().to("cpu", torch.float32) for k, v in arrays.items()}
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rlgrad-npz-writer", daemon=True)
            self._thread.start()
        self._queue.put((Path(path), cpu))

    def _run(self) -> None:
        import numpy as np

        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                path, arrays = item
                try:
                    buf = io.BytesIO()
                    np.savez_compressed(buf, **{k: v.numpy() for k, v in arrays.items()})
                    atomic_write_bytes(path, buf.getvalue())
                    self.written.append(str(path))
                except Exception as e:  # reported, never lost silently; the writer carries on
                    self.failures.append((str(path), f"{type(e).__name__}: {e}"))
                    self.log(f"rlgrad: failed to write {path}: {type(e).__name__}: {e}")
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until everything submitted so far is written (or has failed)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> list[tuple[str, str]]:
        """Write what is queued, stop the worker; returns the failed writes (path, error)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        return self.failures
