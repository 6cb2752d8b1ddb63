"""The step rule: at which steps each instrument runs (``Schedule``), and the one place the config's cadences
become schedules (``schedules``). The trainer, the integrations' hooks and the report all read it here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlgrad.config.algorithm import per_response_advantage

if TYPE_CHECKING:
    from rlgrad.config.schema import RLGradConfig


@dataclass(frozen=True)
class Schedule:
    """The one step rule every instrument uses: due at steps ``first, first + every, ...`` (``every <= 0``: never).

    RAGEN's bucket analysis runs when ``(step - 1) % every == 0`` (``first = 1``: steps 1, 51, 101); ReDo-style
    neuron health when ``step % freq == 0`` (``first = every``: steps N, 2N). ``analysis.every`` puts every
    instrument on RAGEN's steps."""

    every: int
    first: int = 1

    def due(self, step: int) -> bool:
        return self.every > 0 and step >= self.first and (step - self.first) % self.every == 0


def schedules(cfg: RLGradConfig) -> dict[str, Schedule]:
    """``buckets``, ``components``, ``per_sample``, ``neurons/<role>`` (metrics) and ``reset/<role>``.

    Each instrument's own cadence keeps its convention (RAGEN's ``(step - 1) % every`` for the buckets and
    components, ReDo's ``step % every`` for neuron health); ``analysis.every`` puts every instrument that
    applies to the run on steps 1, 1+every, ... (the reward components need one advantage per response, the critic
    exists with gae). Resets keep their own cadence."""
    analysis = cfg.analysis
    outcome = per_response_advantage(cfg.algorithm, cfg.agent.use_turn_scores) is None
    out = {"buckets": Schedule(analysis.buckets.every if analysis.buckets.enable else 0),
           "components": Schedule(analysis.components.every if outcome else 0),
           "per_sample": Schedule(analysis.per_sample.every)}
    for role in ("actor", "critic"):
        neurons = getattr(analysis.neurons, role)
        out[f"neurons/{role}"] = Schedule(neurons.metric_every, neurons.metric_every)
        out[f"reset/{role}"] = Schedule(neurons.reset_every, neurons.reset_every)
    if analysis.every is not None:
        out["buckets"] = Schedule(analysis.every)
        out["components"] = Schedule(analysis.every if outcome else 0)
        out["per_sample"] = Schedule(analysis.every)
        out["neurons/actor"] = Schedule(analysis.every)
        out["neurons/critic"] = Schedule(analysis.every if cfg.algorithm.adv_estimator == "gae" else 0)
    return out
