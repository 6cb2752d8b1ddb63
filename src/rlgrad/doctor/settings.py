"""The settings behind the doctor's words (``rlgrad doctor --explain``): which setting makes a run log a metric a
signature needs, and which of rlgrad's defaults stay against a finding's advice, and why.

A default kept against advice: where the run's value is the default named here, the finding adds the reason's
first sentence to its evidence, and ``--explain`` prints the whole reason; it stays a warning only where the run
measured the harm named here (the signature's ``Finding.harm``), and is a note (info) otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlgrad.metrics import EVERY_STEP, setting_of


def producing_settings(keys: list[str]) -> list[str]:
    """The settings that would log any of ``keys`` (metric keys or templates), each once, in ``keys``' order: what
    the catalogue's group of each key declares (``rlgrad.metrics.setting_of``; rlgrad's names, which the TRL and verl
    integrations take too). A key every training step logs has none to name."""
    out: list[str] = []
    for k in keys:
        found = setting_of(k)
        if found is not None and found != EVERY_STEP and found not in out:
            out.append(found)
    return out


@dataclass(frozen=True)
class KeptDefault:
    finding: str  # the finding whose advice the default goes against
    setting: str
    default: object
    reason: str  # its first sentence: the short form the finding's evidence carries
    harm: str  # what a run measures when the default hurts it: the finding warns only then (``Finding.harm``)


KEPT_DEFAULTS: tuple[KeptDefault, ...] = (
    KeptDefault(
        "std_normalisation_amplifies", "algorithm.norm_adv_by_std_in_grpo", True,
        "rlgrad keeps GRPO's std normalisation on by default, as verl (norm_adv_by_std_in_grpo=True) and TRL "
        "(scale_rewards='group') do, so that a config ported from either trains the same. rlgrad's own runs do not "
        "show it hurting (docs/findings.md): plain `rlgrad train` (20 steps, seeds 1-3) ends at 89.8 / 93.0 / 84.4% "
        "greedy validation accuracy with it and 89.8 / 91.4 / 84.4% without; the demo preset over 60 steps at 75.8 / "
        "84.4% with it, 74.2 / 82.0% without; SmolLM2-135M on chain_sum at 75.0% with it, 57.8% without (one seed). "
        "Dr. GRPO's case against it (nearly unanimous groups get full-size advantages: a difficulty bias) is what the "
        "finding shows; set it false (as the demo preset does) where the low-variance groups' per-sample gradient "
        "outweighs the others' and the run stalls.",
        "the lowest-variance bucket's per-sample task gradient above the highest's while the reward stalls"),
)


def yaml_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def kept_default(finding: str, setting_of: Callable[[str], object]) -> KeptDefault | None:
    """The default kept against ``finding``'s advice, when the run's value of its setting (``setting_of(key)``: the
    run's config, None when unknown) is that default."""
    for kept in KEPT_DEFAULTS:
        value = setting_of(kept.setting) if kept.finding == finding else None
        if value is not None and value == kept.default and isinstance(value, bool) == isinstance(kept.default, bool):
            return kept
    return None
