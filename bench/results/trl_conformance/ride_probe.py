"""pytest plugin (a probe, not part of the conformance check): for each test of TRL's test file run against rlgrad's
subclass, how many of TRL's ``compute_loss`` calls the instruments rode on (``_Instruments.ride`` with a tap), so
which tests exercise the ride on TRL's update. Its command is the first line of ride_probe_2026-12-06.txt."""

import json
import os

import pytest

from rlgrad.integrations import trl as trl_integration

COUNTS = {"rides": 0, "calls": 0}
_ride = trl_integration._Instruments.ride


def _counted_ride(self, rows):
    COUNTS["calls"] += 1
    if self.rides() and self.riding is not None:  # the condition under which ride enters the tap
        COUNTS["rides"] += 1
    return _ride(self, rows)


trl_integration._Instruments.ride = _counted_ride


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    for k in COUNTS:
        COUNTS[k] = 0
    yield
    with open(os.environ["RIDE_OUT"], "a") as f:
        f.write(json.dumps({"test": item.name, **COUNTS}) + "\n")
