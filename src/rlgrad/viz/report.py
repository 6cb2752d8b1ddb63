"""``rlgrad report RUN_DIR``: one self-contained HTML file (figures inlined as PNG, CSS inline, no script).

Sections appear only when the run holds their data: configuration, training curves, the gradient
analysis steps (figures and bucket tables), reward components, neuron health, critic, and a short
plain-language reading of what changed, computed by fixed rules from the numbers (``narrative``).
"""

from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path

from rlgrad.errors import UserError
from rlgrad.rundir import atomic_write_text
from rlgrad.viz import data as D
from rlgrad.viz import figures as F
from rlgrad.viz.plot import step_figures

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;background:#f6f7f9;
color:#222;line-height:1.45}
main{max-width:1280px;margin:0 auto;padding:24px 32px 64px;background:#fff;box-shadow:0 0 8px rgba(0,0,0,.06)}
h1{font-size:1.7em;margin:.2em 0}h2{border-bottom:2px solid #e3e6ea;padding-bottom:4px;margin-top:2em}
h3{margin-top:1.4em}.muted{color:#666;font-size:.92em}
figure{margin:12px 0 24px}figure img{max-width:100%;height:auto;border:1px solid #e3e6ea}
figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em;margin:8px 0 16px}
th,td{border:1px solid #d9dde2;padding:3px 8px;text-align:left}th{background:#f0f2f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
ul.reading li{margin:.35em 0}.reading{background:#f3f8ff;border-left:4px solid #3478c6;padding:10px 10px 10px 28px}
details{margin:8px 0}summary{cursor:pointer;font-weight:600}
pre{background:#f6f8fa;padding:10px;overflow-x:auto;font-size:.8em}
nav a{margin-right:14px}
"""


def _img(fig, dpi: int, caption: str = "") -> str:
    if fig is None:
        return ""
    b64 = base64.b64encode(F.png_bytes(fig, dpi)).decode()
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img alt="{html.escape(caption or "figure")}" src="data:image/png;base64,{b64}">{cap}</figure>'


def _cell(v) -> str:
    if isinstance(v, bool) or v is None or isinstance(v, str | list | dict):
        return f"<td>{html.escape('null' if v is None else str(v))}</td>"
    if isinstance(v, float) and not math.isfinite(v):
        return '<td class="num">–</td>'
    return f'<td class="num">{v:.4g}</td>' if isinstance(v, float) else f'<td class="num">{v}</td>'


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _change(a: float, b: float) -> str:
    if a == 0:
        return "from zero" if b != 0 else "unchanged"
    return f"{100 * (b - a) / abs(a):+.0f}%"


# ---------------------------------------------------------------- the plain-language reading


def _top_bucket(m: dict[str, float]) -> tuple[str, float] | None:
    vals = [(b, D.bucket_value(m, b, "task")) for b in D.bucket_names(m)]
    vals = [(b, v) for b, v in vals if math.isfinite(v)]
    return max(vals, key=lambda bv: bv[1]) if vals else None


def _describe_bucket(m: dict[str, float], b: str) -> str:
    names = D.bucket_names(m)
    where = ("the highest-variance bucket" if b == names[-1] else
             "the lowest-variance bucket" if b == names[0] else f"bucket {names.index(b) + 1} of {len(names)}")
    rv = D.bucket_value(m, b, "reward_std_mean")
    return f"{b.replace('_', ' ')} ({where}, mean in-group reward std {rv:.3g})"


def narrative(run: D.RunData) -> list[str]:
    """Sentences computed from the data by fixed rules; each names the numbers it rests on."""
    out: list[str] = []
    s, v = D.series(run, "val/accuracy")
    if len(s) >= 2:
        out.append(f"Validation accuracy went from {_pct(v[0])} (step {s[0]}) to {_pct(v[-1])} (step {s[-1]}), "
                   f"{100 * (v[-1] - v[0]):+.1f} points.")
    elif s:
        out.append(f"Validation accuracy was {_pct(v[0])} at step {s[0]} (one validation only).")
    s, v = D.series(run, "critic/score/mean")
    if len(s) >= 2:
        k = max(1, min(5, len(v) // 3))  # average a few steps at each end: one step's reward is noisy
        a, b = sum(v[:k]) / k, sum(v[-k:]) / k
        if k == 1:
            out.append(f"Mean training reward went from {a:.3g} at step {s[0]} to {b:.3g} at step {s[-1]} ({_change(a, b)}).")
        else:
            out.append(f"Mean training reward averaged {a:.3g} over the first {k} steps and {b:.3g} over the last {k} "
                       f"({_change(a, b)}).")
    s, v = D.series(run, "response_length/mean")
    if len(s) >= 2 and v[0] != v[-1]:
        out.append(f"Mean response length moved from {v[0]:.3g} to {v[-1]:.3g} tokens.")
    s, v = D.series(run, "actor/grad_norm")
    if len(s) >= 2:
        out.append(f"The actor's gradient norm (before clipping) went from {v[0]:.3g} at step {s[0]} to "
                   f"{v[-1]:.3g} at step {s[-1]}; median {sorted(v)[len(v) // 2]:.3g}.")

    steps = D.analysis_steps(run)
    if steps:
        first, last = steps[0], steps[-1]
        for label, st in (("At", first), ("At", last)) if first != last else (("At", first),):
            m = run.metrics(st)
            top = _top_bucket(m)
            if top is None:
                continue
            allv = D.bucket_value(m, "all", "task")
            if top[1] == 0:
                out.append(f"{label} step {st} every bucket's task gradient is zero: no group had reward variance, "
                           "so every advantage was zero.")
                continue
            out.append(f"{label} step {st} the task gradient is largest in {_describe_bucket(m, top[0])}: norm "
                       f"{top[1]:.3g}" + (f", against {allv:.3g} for the whole batch." if math.isfinite(allv) else "."))
        if first != last:
            a, b = D.bucket_value(run.metrics(first), "all", "task"), D.bucket_value(run.metrics(last), "all", "task")
            ta, tb = _top_bucket(run.metrics(first)), _top_bucket(run.metrics(last))
            moved = "stayed in the same bucket" if ta and tb and ta[0] == tb[0] else "moved to another bucket"
            if math.isfinite(a) and math.isfinite(b):
                out.append(f"Between steps {first} and {last} the largest task gradient {moved}, and the whole-batch "
                           f"task gradient norm went from {a:.3g} to {b:.3g} ({_change(a, b)}).")
        m = run.metrics(last)
        names = D.bucket_names(m)
        zero = [b for b in names if D.bucket_value(m, b, "reward_std_max", 1.0) == 0]
        if zero and len(zero) < len(names):
            share = sum(D.bucket_value(m, b, "sample_pct", 0.0) for b in zero)
            out.append(f"At step {last}, {len(zero)} of {len(names)} buckets ({share:.0f}% of samples) hold only groups "
                       "with zero reward std: every sample of a prompt got the same reward, so their task gradient "
                       "is zero and only the regularisers move them.")
        task = [D.bucket_value(m, b, "task") for b in names]
        fin = [t for t in task if math.isfinite(t)]
        if len(fin) >= 3 and max(fin) > 0:
            if all(x <= y + 1e-12 for x, y in zip(fin, fin[1:])):
                out.append(f"At step {last} the task gradient norm never decreases from a lower- to a higher-variance "
                           "bucket: it grows with reward variance.")
            else:
                peak = names[task.index(max(fin))]
                out.append(f"At step {last} the task gradient norm is not monotone in reward variance; it peaks at "
                           f"{peak.replace('_', ' ')}.")
        regc = [c for c in ("kl", "entropy") if D.has_component(m, c)]
        regname = " + ".join("KL" if c == "kl" else c for c in regc)
        if regc:
            reg = {b: sum(D.bucket_value(m, b, c, 0.0) for c in regc) for b in names}
            dom = [b for b in names if reg[b] > D.bucket_value(m, b, "task", 0.0)]
            lows = names[: max(1, len(names) // 2)]
            if dom:
                low_note = " — the low-variance half" if set(dom) <= set(lows) else ""
                out.append(f"At step {last} the regulariser gradient ({regname}) exceeds the task gradient in "
                           f"{', '.join(b.replace('_', ' ') for b in dom)}{low_note}: those groups are pushed mainly by "
                           "the regularisers.")
            else:
                ratio = min(D.bucket_value(m, b, "task", 0.0) / reg[b] for b in names if reg[b] > 0) if any(
                    reg[b] > 0 for b in names) else math.inf
                out.append(f"At step {last} the task gradient exceeds the regulariser gradient ({regname}) in "
                           f"every bucket" + (f" (by at least {ratio:.3g}×)." if math.isfinite(ratio) else "."))
        else:
            out.append("No regulariser gradient was computed (entropy coefficient 0 and no KL loss), so the task "
                       "gradient is the whole update.")
    else:
        out.append("This run has no gradient-analysis step (trainer.gradient_analysis_mode off, or no step "
                   "matched trainer.gradient_analysis_every).")

    rc = D.reward_components(run)
    if rc:
        s0, s1 = min(rc), max(rc)
        parts = []
        for c in rc[s1].get("components", []):
            a = rc[s0].get("stats", {}).get(c, {}).get("mean")
            b = rc[s1].get("stats", {}).get(c, {}).get("mean")
            if a is not None and b is not None:
                parts.append(f"{c} {a:.3g} → {b:.3g}")
        if parts:
            out.append(f"Reward components (mean per sample, step {s0} → {s1}): {', '.join(parts)}.")
    csteps = D.component_steps(run)
    if csteps:
        geom = D.component_geometry(run, csteps[-1]) or {}
        cos = geom.get("global", {}).get("cosine", {})
        words = []
        for pair, c in sorted(cos.items()):
            a, b = pair.split("__", 1)
            kind = ("aligned" if c > 0.5 else "in conflict" if c < -0.1 else "nearly orthogonal" if abs(c) < 0.1
                    else "weakly aligned")
            words.append(f"{a} and {b} are {kind} (cosine {c:+.2f})")
        if words:
            out.append(f"At step {csteps[-1]} the reward components' gradients: {'; '.join(words)}.")
    for role in D.ROLES:
        s, v = D.series(run, f"{role}/neuron/dormant_ratio")
        if len(s) >= 2:
            trend = "rose" if v[-1] > v[0] else "fell" if v[-1] < v[0] else "stayed"
            out.append(f"The {role}'s dormant-neuron ratio {trend} from {_pct(v[0])} (step {s[0]}) to {_pct(v[-1])} "
                       f"(step {s[-1]}).")
        elif s:
            out.append(f"The {role}'s dormant-neuron ratio was {_pct(v[0])} at step {s[0]}.")
    s, v = D.series(run, "critic/vf_explained_var")
    if s:
        out.append(f"The critic explains {_pct(v[-1])} of the return variance at step {s[-1]}"
                   + (f" (from {_pct(v[0])} at step {s[0]})." if len(s) > 1 else "."))
    return out


# ---------------------------------------------------------------- sections

KEY_SETTINGS = [
    ("data.task", "task"), ("model.path", "model path (null: the embedded default)"), ("algorithm.adv_estimator", "advantages"),
    ("algorithm.norm_adv_by_std_in_grpo", "GRPO std normalisation"), ("actor.policy_loss", "policy loss"),
    ("actor.loss_agg_mode", "loss aggregation"), ("actor.optim.lr", "learning rate"),
    ("actor.use_kl_loss", "KL loss"), ("actor.kl_loss_coef", "KL coefficient"), ("actor.entropy_coeff", "entropy coefficient"),
    ("actor.max_grad_norm", "gradient clip"), ("data.train_batch_size", "prompts per step"), ("rollout.n", "samples per prompt"),
    ("rollout.response_length", "max response tokens"), ("rollout.temperature", "temperature"),
    ("trainer.total_training_steps", "training steps"), ("trainer.gradient_analysis_every", "analysis every"),
    ("rollout.gradient_analysis_bucket_mode", "bucket mode"), ("rollout.gradient_analysis_num_buckets", "buckets"),
]


def _config_section(run: D.RunData) -> str:
    if run.config is None and run.config_text is None:
        return ""
    rows = [[label, D.config_get(run, key, "–"), key] for key, label in KEY_SETTINGS
            if D.config_get(run, key, "__missing__") != "__missing__"]
    full = f"<details><summary>full config.yaml</summary><pre>{html.escape(run.config_text)}</pre></details>" \
        if run.config_text else ""
    return ('<section id="config"><h2>Run configuration</h2>' + _table(["setting", "value", "key"], rows) + full
            + "</section>")


def _bucket_table(run: D.RunData, step: int) -> str:
    m = run.metrics(step)
    names = [*D.bucket_names(m), *(["all"] if any(k.startswith(f"{D.PREFIX}/all/") for k in m) else [])]
    comps = [c for c in D.GRAD_COMPONENTS if D.has_component(m, c)]
    header = ["bucket", "groups", "samples", "% samples", "RV mean", "RV min", "RV max",
              *[f"‖∇ {c}‖" for c in comps], "policy loss", "total loss"]
    rows = [[b, D.bucket_value(m, b, "group_rv_count"), D.bucket_value(m, b, "sample_count"),
             D.bucket_value(m, b, "sample_pct"), D.bucket_value(m, b, "reward_std_mean"),
             D.bucket_value(m, b, "reward_std_min"), D.bucket_value(m, b, "reward_std_max"),
             *[D.bucket_value(m, b, c) for c in comps], D.bucket_value(m, b, "loss/policy"),
             D.bucket_value(m, b, "loss/total")] for b in names]
    return _table(header, rows)


def _pick(steps: list[int], k: int) -> list[int]:
    """At most ``k`` steps, evenly spaced, the last one always included."""
    if len(steps) <= k:
        return steps
    if k <= 1:
        return steps[-1:] if k == 1 else []
    idx = sorted({round(i * (len(steps) - 1) / (k - 1)) for i in range(k)})
    return [steps[i] for i in idx]


def _analysis_section(run: D.RunData, dpi: int, max_steps: int) -> str:
    steps = D.analysis_steps(run)
    if not steps:
        return ""
    parts = ['<section id="analysis"><h2>Gradient analysis by reward-variance bucket</h2>',
             f'<p class="muted">Analysis steps: {", ".join(map(str, steps))}. Bucket 1 holds the prompt groups with the '
             "lowest in-group reward std; <em>all</em> is the whole batch. Norms are L2 norms over all trainable "
             "parameters of each bucket's own aggregated loss, before clipping.</p>"]
    shown = _pick(steps, max_steps)
    if len(steps) >= 2:
        parts.append(_img(F.fig_bucket_trend(run, steps), dpi, "Per-bucket task gradient norm and reward std over the "
                                                             "analysis steps."))
        parts.append(_img(F.fig_steps_grid([(f"Step {s}", run.metrics(s)) for s in _pick(steps, 6)], "run",
                                           f"Gradient norm vs reward variance across steps — run {run.name}"), dpi,
                          "The paper-style grid (rlgrad plot-steps): one row per analysis step."))
    if len(shown) < len(steps):
        parts.append(f'<p class="muted">Figures below for steps {", ".join(map(str, shown))}; '
                     f"<code>rlgrad plot {html.escape(run.source)}</code> draws every step.</p>")
    for s in shown:
        figs = step_figures(run, s)
        is_open = " open" if s in (shown[0], shown[-1]) else ""
        parts.append(f"<details{is_open}><summary>Step {s}</summary>")
        parts.append(_bucket_table(run, s))
        for name, fig in figs.items():
            parts.append(_img(fig, dpi, f"step {s}: {name.replace('_', ' ')}"))
        parts.append("</details>")
    parts.append("</section>")
    return "".join(parts)


def _components_section(run: D.RunData, dpi: int) -> str:
    trend = F.fig_reward_components(run)
    csteps = [s for s in D.component_steps(run) if s not in D.analysis_steps(run)]  # others are drawn per step
    if trend is None and not D.component_steps(run):
        return ""
    parts = ['<section id="rewards"><h2>Reward components</h2>', _img(trend, dpi, "Reward components over training.")]
    rc = D.reward_components(run)
    if rc:
        last = rc[max(rc)]
        rows = [[c, last.get("weights", {}).get(c, math.nan), *(last.get("stats", {}).get(c, {}).get(k, math.nan)
                                                               for k in ("mean", "std", "min", "max"))]
                for c in last.get("components", [])]
        parts.append(f"<h3>Step {max(rc)}</h3>" + _table(["component", "weight", "mean", "std", "min", "max"], rows))
    for s in _pick(csteps, 2):
        geom = D.component_geometry(run, s)
        if geom:
            parts.append(_img(F.fig_components(geom, f"Reward-component gradient geometry — run {run.name}, step {s}"),
                              dpi, f"step {s}: component gradients"))
    if D.component_steps(run) and not csteps:
        parts.append('<p class="muted">Component-gradient geometry is drawn with each analysis step above.</p>')
    parts.append("</section>")
    return "".join(parts)


def _neurons_section(run: D.RunData, dpi: int) -> str:
    trend = F.fig_neuron_trend(run)
    nsteps = D.neuron_steps(run)
    if trend is None and not nsteps:
        return ""
    parts = ['<section id="neurons"><h2>Neuron health</h2>', _img(trend, dpi, "Neuron statistics over training.")]
    if nsteps:
        h = D.neuron_health(run, nsteps[-1])
        if h:
            parts.append(_img(F.fig_neurons(h, f"Neuron health — run {run.name}, step {nsteps[-1]}"), dpi,
                              f"step {nsteps[-1]}: per layer"))
    parts.append("</section>")
    return "".join(parts)


def build_report(run: D.RunData, dpi: int = 90, max_steps: int = 6) -> str:
    """The HTML page; ``max_steps`` analysis steps (evenly spaced, the last included) get their full figures."""
    steps = [s for s in run.rows if s > 0]
    sections = [
        _config_section(run),
        _section("curves", "Training curves", _img(F.fig_training_curves(run), dpi,
                                                  "Training metrics per step (validation where it ran).")),
        _analysis_section(run, dpi, max_steps),
        _components_section(run, dpi),
        _neurons_section(run, dpi),
        _section("critic", "Critic", _img(F.fig_critic(run), dpi, "Value function.")),
    ]
    reading = "".join(f"<li>{html.escape(t)}</li>" for t in narrative(run))
    nav = " ".join(f'<a href="#{sid}">{title}</a>' for sid, title in (
        ("reading", "What changed"), ("config", "Configuration"), ("curves", "Training curves"),
        ("analysis", "Gradient analysis"), ("rewards", "Reward components"), ("neurons", "Neuron health"),
        ("critic", "Critic")) if sid == "reading" or any(f'id="{sid}"' in s for s in sections))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rlgrad report — {html.escape(run.name)}</title>
<style>{CSS}</style></head>
<body><main>
<h1>rlgrad report — {html.escape(run.name)}</h1>
<p class="muted">{html.escape(run.source)} · {len(steps)} training step{'s' * (len(steps) != 1)} · \
{len(D.analysis_steps(run))} analysis step{'s' * (len(D.analysis_steps(run)) != 1)} · \
generated {time.strftime('%Y-%m-%d %H:%M')}</p>
<nav>{nav}</nav>
<section id="reading"><h2>What changed</h2><ul class="reading">{reading}</ul></section>
{''.join(sections)}
</main></body></html>
"""


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{title}</h2>{body}</section>' if body else ""


def report_command(run_dir: str, output: str | None, dpi: int = 90, max_steps: int = 6) -> int:
    run = D.load_run(run_dir)
    out = Path(output) if output else Path(run_dir) / "report.html"
    if out.is_dir():
        raise UserError(f"--output '{out}' is a directory; give a file name")
    atomic_write_text(out, build_report(run, dpi, max_steps))
    print(f"report written to {out.resolve()}")
    return 0
