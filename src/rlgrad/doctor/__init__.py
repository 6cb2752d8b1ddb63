"""``rlgrad doctor``: is a run healthy, and why did its gradient do what it did?

The package's face, the names a user or another tool needs: ``diagnose`` a run (``rundata.load_any``) into a
``Diagnosis`` of ``Finding``s under ``Thresholds``; ``render_text`` it as the command prints it; ``LiveDoctor`` and
``follow`` for a run being written. Inside: ``findings`` (the pieces a signature is made of, and ``@signature``),
the modules of signatures (``diagnose.SIGNATURE_MODULES``), ``diagnose`` (the engine), ``command`` (the command
line: ``doctor_command``, ``follow_command``), ``live`` / ``follow`` (while a run is written). The loops' hook,
``rlgrad.doctor.hook.DoctorHook``, is not imported here: it meets the hook contract (``rlgrad.hooks``), which
reading a run never needs.
"""

from rlgrad.doctor.command import render_text
from rlgrad.doctor.diagnose import diagnose
from rlgrad.doctor.findings import SEVERITY, SIGNATURES, Diagnosis, Finding, Thresholds, at_or_above
from rlgrad.doctor.follow import follow
from rlgrad.doctor.live import LiveDoctor

__all__ = ["SEVERITY", "SIGNATURES", "Diagnosis", "Finding", "LiveDoctor", "Thresholds", "at_or_above", "diagnose",
           "follow", "render_text"]
