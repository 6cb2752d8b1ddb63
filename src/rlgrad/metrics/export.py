"""The metric catalogue written out: for other tools, one JSON document (``rlgrad metrics``, and
``RUN/metrics_catalogue.json`` next to ``metrics.jsonl``); for people, the page ``docs/metrics.md`` (``docs_page``).

A key's name alone is ambiguous to a tool that does not know rlgrad: rldoctor 0.2.0 read ``rollout/accuracy`` (the
step's training samples) as a held-out score, and a per-bucket ``*/loss/entropy`` as the policy's entropy. So each
catalogue entry goes out with fields that say what its number is measured on (``data``, ``held_out``), what it is
per (``scope``: its placeholders), which instrument writes it, its unit and range where they are known, the names
other tools give the same quantity (derived from ``rlgrad.metrics.foreign``, never a second table) and the keys it is
easily taken for (``distinct_from``). What it is measured on and its writer are its group's
(``rlgrad.metrics.entries``), so a new key gets its group's fields without an edit here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlgrad.errors import UserError
from rlgrad.metrics.entries import DATA, Metric
from rlgrad.metrics.fields import FIELD_MEANINGS, FIELDS
from rlgrad.metrics.foreign import FOREIGN_NAMES, FOREIGN_NOTES, own_key
from rlgrad.metrics.keys import CATALOGUE, GROUPS, declared, match
from rlgrad.runfiles import CATALOGUE_FILE, atomic_write_text

FORMAT = "rlgrad.metrics_catalogue"
FORMAT_VERSION = 1  # bump on any change a reader of an older version would misread (a field's meaning, removal)
RUN_FILE = CATALOGUE_FILE  # written into every run directory next to metrics.jsonl, at run start

# Units with their range (None: unbounded that side), and the keys in each; a key in none has no fixed unit (a
# reward, a loss, a learning rate: the task's or the setting's scale).
UNITS: dict[str, tuple[float | None, float | None]] = {
    "fraction": (0.0, 1.0), "flag": (0.0, 1.0), "percent": (0.0, 100.0), "count": (0.0, None),
    "seconds": (0.0, None), "tokens": (0.0, None), "l2_norm": (0.0, None), "nats": (0.0, None),
    "cosine": (-1.0, 1.0), "correlation": (-1.0, 1.0), "samples": (0.0, None),
}
_UNIT_KEYS: dict[str, tuple[str, ...]] = {
    "fraction": ("rollout/accuracy", "response_length/clip_ratio", "env/success", "env/action_is_valid",
                 "env/action_is_effective", "val/env/success", "val/env/action_is_valid",
                 "val/env/action_is_effective", "rollout/filter_kept_ratio", "reward/{component}/frac_zero_std",
                 "reward/extraction/flexible_share", "critic/score/frac_zero_std", "actor/pg_clipfrac",
                 "actor/pg_clipfrac_lower", "critic/vf_clipfrac", "{role}/neuron/dormant_ratio",
                 "{role}/neuron/act_dormant_ratio", "{role}/neuron/zero_grad_ratio", "{role}/param/zero_grad_ratio",
                 "{role}/neuron/nullspace_ratio", "val/accuracy", "coherence/{bucket}/{term}"),
    "flag": ("rollout/filter_empty", "trainer/exited_after_gradient_analysis"),
    "percent": ("grad_norm/{bucket}/sample_pct", "grad_norm_prefilter/{bucket}/sample_pct"),
    "count": ("env/num_turns", "env/num_actions", "val/env/num_turns", "val/env/num_actions",
              "rollout/filter_kept_count", "rollout/filter_zero_count", "train/num_gen_batches",
              "train/num_gen_samples", "train/num_signal_groups", "actor/nonfinite_grad_steps",
              "critic/nonfinite_grad_steps", "grad_norm/{bucket}/sample_count", "grad_norm/{bucket}/group_rv_count",
              "grad_norm/{bucket}/group_rv_zero_count", "grad_norm_prefilter/{bucket}/sample_count",
              "grad_norm_prefilter/{bucket}/group_rv_count", "grad_norm_prefilter/{bucket}/group_rv_zero_count",
              "noise_samples/{bucket}", "grad_comp/save_failures", "{role}/neuron/reset_count"),
    "tokens": ("response_length/{stat}",),
    "l2_norm": ("actor/grad_norm", "critic/grad_norm", "actor/grad_norm/{term}", "grad_norm/{bucket}/{term}",
                "grad_norm/{bucket}/per_sample/{term}", "grad_norm/{bucket}/per_token/{term}",
                "grad_norm_prefilter/{bucket}/{term}", "grad_norm_prefilter/{bucket}/per_sample/{term}",
                "grad_norm_prefilter/{bucket}/per_token/{term}", "grad_norm_sample/{bucket}/{term}",
                "grad_comp/{component}/norm", "grad_comp/total/norm"),
    "nats": ("actor/entropy",),
    "cosine": ("grad_sim/{pair}",),
    "correlation": ("proxy_corr/spearman", "proxy_corr/pearson"),
    "samples": ("noise_scale/{bucket}/{term}",),
}
_UNIT_OF = {template: unit for unit, keys in _UNIT_KEYS.items() for template in keys}
_DATA_UNIT = {"wall_clock": "seconds"}

# Keys a reader easily takes for one another, each with why they differ (shown on both entries).
_CONFUSED: tuple[tuple[str, str, str], ...] = (
    ("rollout/accuracy", "val/accuracy",
     "rollout/accuracy is over the step's sampled training responses; val/accuracy is the held-out score"),
    ("env/success", "val/env/success", "env/ is the step's training episodes; val/env/ the held-out episodes"),
    ("rollout/score/mean", "critic/score/mean",
     "rollout/score/mean is before the rollout filter; critic/score/mean is over the kept batch"),
    ("grad_norm/{bucket}/loss/{loss}", "actor/entropy",
     "loss=entropy is H over one reward-variance bucket's samples (all: the analysed batch) at analysis steps only; "
     "the policy entropy of every step is actor/entropy"),
    ("grad_norm_prefilter/{bucket}/loss/{loss}", "actor/entropy",
     "loss=entropy is H over one bucket of the batch before the rollout filter at analysis steps only; the policy "
     "entropy of every step is actor/entropy"),
    ("actor/loss/{loss}", "actor/entropy",
     "actor/loss/entropy is the bucket analysis' whole-batch H at analysis steps; the policy entropy of every "
     "step is actor/entropy"),
    ("actor/loss/{loss}", "actor/pg_loss",
     "actor/loss/policy is the bucket analysis' loss before the update; actor/pg_loss the update's"),
    ("actor/grad_norm/{term}", "actor/grad_norm",
     "actor/grad_norm/<term> is one loss term's gradient norm (term=entropy: the entropy term's, with its "
     "coefficient) at analysis steps; actor/grad_norm is the total loss gradient of every update"),
    ("grad_norm/{bucket}/{term}", "actor/grad_norm",
     "grad_norm/<bucket>/<term> is one term's gradient over one bucket at analysis steps; actor/grad_norm is "
     "the update's total gradient"),
    ("coherence/{bucket}/{term}", "actor/entropy",
     "coherence/<bucket>/entropy is the alignment of the entropy term's per-sample gradients, not an entropy"),
    ("grad_norm/{bucket}/per_sample/{term}", "grad_norm_sample/{bucket}/{term}",
     "per_sample/ is ||Σ_i g_i|| / n (RAGEN's); grad_norm_sample/ is the mean of the exact ||g_i||"),
    ("actor/kl_loss", "actor/ppo_kl",
     "actor/kl_loss is the KL to the reference policy; actor/ppo_kl how far the update moved from the sampling policy"),
)


def _names(m: Metric) -> dict[str, dict[str, str]]:
    """Other tools' names of ``m``'s keys, ``{source: {their name: rlgrad's concrete key}}``, from FOREIGN_NAMES
    (a template with a closed placeholder such as ``{stat}`` has one name per concrete key)."""
    out: dict[str, dict[str, str]] = {}
    for source, table in FOREIGN_NAMES.items():
        hits = {name: rlgrad_key for name, rlgrad_key in table.items() if match(rlgrad_key) is m}
        # TRL's per-reward-function keys (rewards/<f>/mean) are a rule of own_key, not rows of the table
        if not hits and m.fields == ("component",):
            probe = m.template.replace("{component}", "COMPONENT")
            theirs = own_key(probe, source)
            if theirs != probe:
                hits = {theirs.replace("COMPONENT", "{reward function}"): m.template}
        if hits:
            out[source] = hits
    return out


def entry(m: Metric) -> dict[str, Any]:
    """The JSON object of one catalogue entry."""
    data = declared(m, "data")
    unit = _UNIT_OF.get(m.template) or _DATA_UNIT.get(data)
    low, high = UNITS[unit] if unit else (None, None)
    confused = {b if a == m.template else a: why for a, b, why in _CONFUSED if m.template in (a, b)}
    return {
        "key": m.template, "regex": m.regex.pattern, "placeholders": list(m.fields), "group": m.group,
        "meaning": m.meaning, "data": data, "held_out": data == "validation",
        "scope": [f"per_{f}" for f in m.fields if f != "stat"] or ["whole"],
        "instrument": declared(m, "writer"),
        "unit": unit, "range": [low, high] if unit else None, "names": _names(m), "distinct_from": confused,
    }


def catalogue(keys: list[str] | None = None) -> dict[str, Any]:
    """The whole catalogue as one JSON-ready document; ``keys``: only the entries of these concrete keys (or
    templates), a one-line error naming a key the catalogue does not declare."""
    entries = list(CATALOGUE)
    if keys:
        unknown = [k for k in keys if match(k) is None and k not in {m.template for m in CATALOGUE}]
        if unknown:
            raise UserError(f"not a key rlgrad logs: {', '.join(unknown)} (rlgrad metrics lists them all)")
        wanted = {match(k) or next(m for m in CATALOGUE if m.template == k) for k in keys}
        entries = [m for m in CATALOGUE if m in wanted]
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "placeholders": {name: {"regex": rx, "meaning": FIELD_MEANINGS.get(name, "")} for name, rx in FIELDS.items()},
        "groups": {g.id: {"title": g.title, "note": g.note, "setting": g.setting, "data": g.data, "writer": g.writer,
                          "files": list(g.files)} for g in GROUPS.values()},
        "data": DATA, "units": {u: list(r) for u, r in UNITS.items()},
        "sources": {s: {"note": FOREIGN_NOTES.get(s, "")} for s in (*FOREIGN_NAMES, "verl", "wandb")},
        "metrics": [entry(m) for m in entries],
    }


def to_json(keys: list[str] | None = None) -> str:
    return json.dumps(catalogue(keys), indent=2, ensure_ascii=False) + "\n"


def write_run_catalogue(run_dir: str | os.PathLike) -> Path:
    """``RUN/metrics_catalogue.json``, atomically, at every start of a run (a resume by a newer rlgrad rewrites it):
    the bytes ``rlgrad metrics`` prints."""
    path = Path(run_dir) / RUN_FILE
    atomic_write_text(path, to_json())
    return path


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """``docs/metrics.md``: the catalogue as Markdown, a table per group, under what its group declares (the setting
    that makes a run log its keys, what they are measured on, their writer and its run files)."""
    out = [
        "# Metrics",
        "",
        "Every key rlgrad logs (`RUN/metrics.jsonl`, TensorBoard, W&B), as a template with its meaning. "
        "A `{field}` is a placeholder for the values in the first table. This file is generated from "
        "`rlgrad.metrics.CATALOGUE` (`rlgrad metrics --format markdown > docs/metrics.md`): edit the catalogue, "
        "not this file. Search for a template (e.g. `grad_norm/{bucket}/{term}`) to find the code that "
        "writes it; `rlgrad.metrics.match(key)` gives the entry of a concrete key.",
        "",
        "## Placeholders",
        "",
        "| placeholder | matches | meaning |",
        "|---|---|---|",
    ]
    out += [f"| `{{{name}}}` | `{_cell(rx)}` | {_cell(FIELD_MEANINGS.get(name, ''))} |"
            for name, rx in FIELDS.items()]
    for group in GROUPS.values():
        files = f"; its files: {', '.join(f'`{f}`' for f in group.files)}" if group.files else ""
        out += ["", f"## {group.title}", "", group.note, "",
                f"Logged with: {group.setting}. Measured on: {DATA[group.data]}. Written by: `{group.writer}`{files}.",
                "", "| key | meaning |", "|---|---|"]
        out += [f"| `{m.template}` | {_cell(m.meaning)}" + (f" Logged with: {m.setting}." if m.setting else "") + " |"
                for m in group.metrics]
    return "\n".join(out) + "\n" + foreign_markdown()


def foreign_markdown() -> str:
    """docs/metrics.md's table of other trainers' names: one row per rlgrad key, a column per trainer."""
    keys = list(dict.fromkeys(v for t in FOREIGN_NAMES.values() for v in t.values()))
    heads = list(FOREIGN_NAMES)
    out = ["", "## Other trainers' names", "",
           "What `rlgrad doctor` (and rlgrad's TRL integration) reads another trainer's logs as, from "
           "`rlgrad.metrics.FOREIGN_NAMES`; `rewards/<f>/mean` and `/std` (TRL) are `reward/<f>/mean` and `/std`. "
           "verl's names are rlgrad's. A `train/` prefix (W&B, TensorBoard) is dropped.", "",
           "| rlgrad | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for k in keys:
        cells = [", ".join(f"`{n}`" for n, v in FOREIGN_NAMES[h].items() if v == k) or "-" for h in heads]
        out.append(f"| `{k}` | " + " | ".join(cells) + " |")
    out += ["", *[f"- {src}: {_cell(note)}" for src, note in FOREIGN_NOTES.items()]]
    return "\n".join(out) + "\n"


def export_markdown() -> str:
    """docs/metrics.md's section on the JSON export."""
    sample = {k: v for k, v in entry(match("rollout/accuracy")).items() if k != "meaning"}
    return "\n".join([
        "", "## For other tools: the catalogue as JSON", "",
        f"`rlgrad metrics` prints this catalogue as one JSON document (`\"format\": \"{FORMAT}\"`, "
        f"`\"format_version\": {FORMAT_VERSION}`); `rlgrad metrics KEY ...` prints only the entries of those keys, "
        f"and every run directory holds the same document as `{RUN_FILE}`, written at the run's start, next to "
        "`metrics.jsonl`. A key's name alone can mislead another tool (rldoctor 0.2.0 takes `rollout/accuracy`, "
        "training samples, for a held-out score, and a per-bucket `*/loss/entropy` for the policy entropy), so "
        "each entry says: `data` (what the value is measured on: "
        + ", ".join(f"`{d}`" for d in DATA) + "; `held_out` is true for `validation` alone), `scope` (`whole` or "
        "`per_<placeholder>`), the `instrument` that writes it, `unit` and `range` where fixed (else null), "
        "`names` (other tools' names for it, `{source: {their name: rlgrad's key}}`, from the table above) and "
        "`distinct_from` (keys it is easily taken for, with why). `regex` matches the entry's concrete keys "
        "(Python `re.fullmatch`); where two match, the entry whose `key` has more characters outside its "
        "placeholders wins, then the one with fewer placeholders (`rlgrad.metrics.match`). The entry of "
        "`rollout/accuracy`, its meaning left out:", "",
        "```json", json.dumps(sample, indent=2, ensure_ascii=False), "```", "",
    ])


def docs_page() -> str:
    """``docs/metrics.md``: the catalogue for people (``rlgrad.metrics.markdown``), then the export's section."""
    return markdown() + export_markdown()
