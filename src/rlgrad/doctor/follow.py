"""``rlgrad doctor RUN --follow``: the doctor on a run being written, in any format ``rundata.load_any`` reads: each
poll reads the run again and hands the steps it has not seen to a live doctor (``rlgrad.doctor.live``), which
prints each new finding once. It ends when the run does (an rlgrad run directory: its writer released
``RUN/.lock``; any other format: no new step for ``idle`` seconds), or at Ctrl-C.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from rlgrad import rundata as D
from rlgrad.doctor.findings import SEVERITY, Thresholds
from rlgrad.doctor.live import LiveDoctor
from rlgrad.runfiles import METRICS_FILE, being_written


def follow(path: str, thresholds: Thresholds | None = None, interval: float = 2.0, idle: float = 600.0,
           say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> str:
    """Follow the run at ``path`` until it ends; returns the most serious severity said ('' for none)."""
    p = Path(path)
    doctor: LiveDoctor | None = None
    seen, last_new = 0, clock()
    worst = ""
    while True:
        run = D.load_any(p)
        if doctor is None:  # the writer's settings and names, once it wrote them
            doctor = LiveDoctor(None, run.config, kind=run.kind, settings=run.settings, thresholds=thresholds,
                                say=say)
        new = [s for s in sorted(set(run.rows) | set(run.nonfinite)) if s > seen]
        for s in new:
            row = {**run.rows.get(s, {}), **dict.fromkeys(run.nonfinite.get(s, []), math.nan)}
            # every step diagnosed: the time is the follower's own, not the run's (no budget to keep)
            for f in doctor.observe(s, row, step_seconds=math.inf):
                worst = min(worst or f.severity, f.severity, key=SEVERITY.get)
        if new:
            seen, last_new = new[-1], clock()
        done = (not being_written(p)) if (p / METRICS_FILE).is_file() else clock() - last_new > idle
        if done:
            if seen:
                doctor.finish(run)
            say(f"[doctor] {p}: the run ended at step {seen}" if seen else f"[doctor] {p}: no steps")
            return worst
        time.sleep(interval)
