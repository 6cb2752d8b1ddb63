"""Which steps each instrument runs at: the one place the config's cadences become ``hooks.Schedule``s."""

from __future__ import annotations

from rlgrad.config import RLGradConfig, per_response_advantage
from rlgrad.hooks import Schedule


def schedules(cfg: RLGradConfig) -> dict[str, Schedule]:
    """``buckets``, ``components``, ``neurons/<role>`` (metrics) and ``reset/<role>``.

    Each instrument's own cadence keeps its convention (RAGEN's ``(step - 1) % every`` for the buckets and
    components, ReDo's ``step % every`` for neuron health); ``analysis.every`` puts every instrument that
    applies to the run on steps 1, 1+every, ... (the reward components need one advantage per response, the critic
    exists with gae). Resets keep their own cadence."""
    a = cfg.analysis
    outcome = per_response_advantage(cfg.algorithm, cfg.agent.use_turn_scores) is None
    out = {"buckets": Schedule(a.buckets.every if a.buckets.enable else 0),
           "components": Schedule(a.components.every if outcome else 0)}
    for role in ("actor", "critic"):
        n = getattr(a.neurons, role)
        out[f"neurons/{role}"] = Schedule(n.metric_every, n.metric_every)
        out[f"reset/{role}"] = Schedule(n.reset_every, n.reset_every)
    if a.every is not None:
        out["buckets"] = Schedule(a.every)
        out["components"] = Schedule(a.every if outcome else 0)
        out["neurons/actor"] = Schedule(a.every)
        out["neurons/critic"] = Schedule(a.every if cfg.algorithm.adv_estimator == "gae" else 0)
    return out
