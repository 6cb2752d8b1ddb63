"""``rlgrad report RUN_DIR``: one self-contained HTML file (figures inlined as PNG, CSS inline, no script).

Sections appear only when the run holds their data: configuration, training curves, the gradient
analysis steps (figures, bucket tables, and a few prompt groups of the lowest- and highest-variance buckets
with what the model wrote, from rollouts/step_N.jsonl), per-sample gradients, reward components, neuron health,
critic, and a short plain-language reading of what changed, computed by fixed rules from the numbers (``narrative``).
"""

from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path

from rlgrad import rundata as D
from rlgrad.config.schedule import Schedule, schedules
from rlgrad.config.schema import RLGradConfig
from rlgrad.doctor import diagnose
from rlgrad.doctor.findings import View, fmt
from rlgrad.doctor.noise import noise_scale
from rlgrad.errors import UserError
from rlgrad.metrics import BUCKETS, INSTRUMENTS, NEURONS, Instrument
from rlgrad.runfiles import atomic_write_text, check_output
from rlgrad.viz import run_figures as R
from rlgrad.viz.figbase import png_bytes
from rlgrad.viz.plot import RAGEN_FIGURES, step_figures
from rlgrad.viz.reading import narrative
from rlgrad.viz.sample_figures import fig_per_sample
from rlgrad.viz.terms import terms_block, terms_section

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;\
margin:0;background:#f6f7f9;
color:#222;line-height:1.45}
main{max-width:1280px;margin:0 auto;padding:24px 32px 64px;background:#fff;box-shadow:0 0 8px rgba(0,0,0,.06)}
h1{font-size:1.7em;margin:.2em 0}h2{border-bottom:2px solid #e3e6ea;padding-bottom:4px;margin-top:2em}
h3{margin-top:1.4em}.muted{color:#666;font-size:.92em}
figure{margin:12px 0 24px}figure img{max-width:100%;height:auto;border:1px solid #e3e6ea}
figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em;margin:8px 0 16px}
th,td{border:1px solid #d9dde2;padding:3px 8px;text-align:left}th{background:#f0f2f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
ul.reading li{margin:.35em 0}\
.reading{background:#f3f8ff;border-left:4px solid #3478c6;padding:10px 10px 10px 28px}\
.finding{margin:.5em 0;padding:6px 10px;border-left:4px solid #999}.finding.critical{border-color:#c0392b;\
background:#fdf0ef}.finding.warn{border-color:#d68910;background:#fef8ec}.finding.info{border-color:#3478c6}
details{margin:8px 0}summary{cursor:pointer;font-weight:600}
details.finding summary{font-weight:400}
pre{background:#f6f8fa;padding:10px;overflow-x:auto;font-size:.8em}
nav a{margin-right:14px}
details.terms{font-size:.88em;color:#444}details.terms summary{font-weight:400;color:#666}
details.terms ul{margin:4px 0 8px}dl dt{font-weight:600;margin-top:.6em}dl dd{margin-left:1.2em}
.samples{margin:6px 0 18px}.samples p{margin:10px 0 4px}
.samples pre{margin:2px 0 4px;padding:6px 8px;white-space:pre-wrap;word-break:break-word}
td.text{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;white-space:pre-wrap;\
word-break:break-word;max-width:640px}
"""


def _img(fig, dpi: int, caption: str = "") -> str:
    if fig is None:
        return ""
    b64 = base64.b64encode(png_bytes(fig, dpi)).decode()
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    alt = html.escape(caption or "figure")
    return f'<figure><img alt="{alt}" src="data:image/png;base64,{b64}">{cap}</figure>'


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


# ---------------------------------------------------------------- sections

KEY_SETTINGS = [
    ("data.task", "task"), ("model.path", "model path (null: the embedded default)"),
    ("algorithm.adv_estimator", "advantages"),
    ("algorithm.norm_adv_by_std_in_grpo", "GRPO std normalisation"), ("actor.policy_loss", "policy loss"),
    ("actor.loss_agg_mode", "loss aggregation"), ("actor.optim.lr", "learning rate"),
    ("actor.use_kl_loss", "KL loss"), ("actor.kl_loss_coef", "KL coefficient"),
    ("actor.entropy_coeff", "entropy coefficient"),
    ("actor.max_grad_norm", "gradient clip"), ("data.train_batch_size", "prompts per step"),
    ("rollout.n", "samples per prompt"),
    ("rollout.response_length", "max response tokens"), ("rollout.temperature", "temperature"),
    ("trainer.total_training_steps", "training steps"),
    ("algorithm.use_kl_in_reward", "KL in the reward"), ("algorithm.filter_groups.enable", "dynamic sampling (DAPO)"),
    ("reward.overlong_buffer.enable", "overlong penalty (DAPO)"),
]


def _instrument_rows(run: D.RunData) -> list[list]:
    """When each instrument ran: "off", or its steps, by the step rule the instruments themselves follow
    (``rlgrad.config.schedule.schedules``) applied to the run's own settings; a row for every instrument of the
    catalogue (``rlgrad.metrics.INSTRUMENTS``; the actor's schedule where each trained model has one), each followed
    by the settings that shaped what it measured. Nothing for a config that could not be read."""
    if run.config is None:
        return []
    settings = run.saved.settings
    at = schedules(settings)

    def when(schedule: Schedule) -> str:
        if schedule.every <= 0:
            return "off"
        return f"every {schedule.every} (steps {schedule.first}, {schedule.first + schedule.every}, …)"

    rows = []
    for instrument in INSTRUMENTS:
        rows.append([instrument.name, when(at[instrument.schedule.format(role="actor")]),
                     instrument.every.format(role="actor")])
        rows += _instrument_details(instrument, settings, at)
    return rows


def _instrument_details(instrument: Instrument, settings: RLGradConfig, at: dict[str, Schedule]) -> list[list]:
    """The rows under an instrument's: the bucket analysis' buckets (when it ran), the neuron health's resets."""
    if instrument is BUCKETS and at["buckets"].every > 0:
        buckets = settings.analysis.buckets
        return [["bucket mode", buckets.bucket_mode, "analysis.buckets.bucket_mode"],
                ["buckets", buckets.num_buckets, "analysis.buckets.num_buckets"]]
    if instrument is NEURONS:
        actor, resets = settings.analysis.neurons.actor, at["reset/actor"].every
        return [["ReDo resets", f"every {resets} (τ {actor.tau}, {actor.mode})" if resets > 0 else "off",
                 "analysis.neurons.actor.reset_every"]]
    return []


def _config_section(run: D.RunData) -> str:
    if run.config is None and run.config_text is None:
        return ""
    rows = [[label, D.config_get(run, key, "–"), key] for key, label in KEY_SETTINGS
            if D.config_get(run, key, "__missing__") != "__missing__"] + _instrument_rows(run)
    full = (f"<details><summary>full config.yaml</summary><pre>{html.escape(run.config_text)}</pre></details>"
            if run.config_text else "")
    return ('<section id="config"><h2>Run configuration</h2>' + _table(["setting", "value", "key"], rows)
            + full + "</section>")


def _bucket_table(run: D.RunData, step: int) -> str:
    m = run.metrics(step)
    names = [*D.bucket_names(m), *(["all"] if any(k.startswith(f"{D.PREFIX}/all/") for k in m) else [])]
    comps = [c for c in D.GRAD_COMPONENTS if D.has_component(m, c)]
    header = ["bucket", "groups", "samples", "% samples", "reward std mean", "reward std min", "reward std max",
              *[f"‖∇ {c}‖" for c in comps], "policy loss", "total loss"]
    rows = [[b, D.bucket_value(m, b, "group_rv_count"), D.bucket_value(m, b, "sample_count"),
             D.bucket_value(m, b, "sample_pct"), D.bucket_value(m, b, "reward_std_mean"),
             D.bucket_value(m, b, "reward_std_min"), D.bucket_value(m, b, "reward_std_max"),
             *[D.bucket_value(m, b, c) for c in comps], D.bucket_value(m, b, "loss/policy"),
             D.bucket_value(m, b, "loss/total")] for b in names]
    return _table(header, rows)


SAMPLE_GROUPS = 2  # prompt groups shown from each of the lowest- and highest-variance buckets
SAMPLE_CHARS = 300  # a response longer than this is shown as its head and tail


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head, tail = text[:2 * limit // 3], text[len(text) - limit // 3:]
    return f"{head} … [{len(text) - len(head) - len(tail)} characters] … {tail}"


def _samples_block(run: D.RunData, step: int) -> str:
    """A few prompt groups of the lowest- and highest-variance buckets with what the model wrote
    (rollouts/step_N.jsonl joined with the step's group table); empty when the run has neither."""
    groups = [g for g in D.rollout_groups(run, step) if g.bucket]
    buckets = D.sort_buckets(g.bucket for g in groups)
    if not buckets:
        return ""
    picks = [(buckets[0], "lowest reward variance", False)]
    if len(buckets) > 1:
        picks.append((buckets[-1], "highest reward variance", True))
    parts = ['<div class="samples"><p><b>What the model wrote</b> <span class="muted">(a few prompt groups; all '
             f"of them: <code>rlgrad samples {html.escape(run.source)} --step {step}</code>)</span></p>"]
    for bucket, label, high in picks:
        chosen = sorted((g for g in groups if g.bucket == bucket),
                        key=lambda g: (-g.reward_std if high else g.reward_std, g.group_id))[:SAMPLE_GROUPS]
        for g in chosen:
            comps = list(dict.fromkeys(c for smp in g.samples for c in (smp.get("components") or {})))
            parts.append(f"<p>group {g.group_id} · {html.escape(bucket)} ({label}) · reward std "
                         f"{g.reward_std:.3g}</p><pre>{html.escape(_clip(g.prompt, 2 * SAMPLE_CHARS))}</pre>")
            head = "".join(f"<th>{html.escape(h)}</th>" for h in ["#", "total", *(D.label(run, c) for c in comps),
                                                                   "advantage", "finish",
                                                                   "tokens", "response"])
            rows = []
            for smp in g.samples:
                vals = [smp.get("total"), *((smp.get("components") or {}).get(c) for c in comps),
                        smp.get("advantage"), smp.get("finish_reason"), smp.get("response_length")]
                cells = "".join(_cell("–" if v is None else v) for v in vals)
                text = (html.escape(_clip(str(smp.get("response")), SAMPLE_CHARS)) if smp.get("response")
                        else '<span class="muted">(empty)</span>')
                rows.append(f'<tr><td class="num">{html.escape(str(smp.get("index", "")))}</td>{cells}'
                            f'<td class="text">{text}</td></tr>')
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    parts.append("</div>")
    return "".join(parts)


MAIN_STEP_FIGURES = ("summary", "components", "neurons")  # shown open in a step of the report; the others folded


def _pick(steps: list[int], k: int) -> list[int]:
    """At most ``k`` steps, evenly spaced, the last one always included."""
    if len(steps) <= k:
        return steps
    if k <= 1:
        return steps[-1:] if k == 1 else []
    idx = sorted({round(i * (len(steps) - 1) / (k - 1)) for i in range(k)})
    return [steps[i] for i in idx]


BUCKET_FIGURES = (*RAGEN_FIGURES, "layers")  # the figures drawn from the buckets


def _all_gradients_zero(m: dict[str, float]) -> bool:
    """Every gradient norm of every bucket (task, KL, entropy) is 0 at this step (none missing either)."""
    vals = [D.bucket_value(m, b, c) for b in D.bucket_names(m) for c in D.GRAD_COMPONENTS if D.has_component(m, c)]
    return bool(vals) and all(v == 0 for v in vals)


def _steps_text(steps: list[int]) -> str:
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(map(str, steps))


def _analysis_section(run: D.RunData, dpi: int, max_steps: int) -> str:
    steps = D.analysis_steps(run)
    if not steps:
        return ""
    parts = ['<section id="analysis"><h2>Gradient analysis by reward-variance bucket</h2>',
             f'<p class="muted">Analysis steps: {", ".join(map(str, steps))}. Bucket 1 holds the prompt '
             "groups with the lowest in-group reward std; <em>all</em> is the whole batch. Norms are L2 "
             "norms over all trainable parameters of each bucket's own aggregated loss, before clipping.</p>",
             terms_block("analysis")]
    shown = _pick(steps, max_steps)
    zero = [s for s in steps if _all_gradients_zero(run.metrics(s))]
    if zero == steps:  # nothing to draw: panels of dots on 0 would only hide that
        parts.append(f"<p><b>Every bucket's gradient is zero at every analysis step</b> ({_steps_text(steps)}): "
                     "no prompt group had reward variance, so every advantage and every task gradient was 0; "
                     "no figure is drawn. The tables below show the buckets' reward spreads.</p>")
    elif zero:
        parts.append(f"<p>At {_steps_text(zero)} every bucket's gradient is zero (no reward variance): those "
                     "steps get their tables, not figures.</p>")
    if len(steps) - len(zero) >= 2:
        parts.append(_img(R.fig_bucket_trend(run, steps), dpi,
                          "Per-bucket task gradient norm and reward std over the analysis steps."))
        grid = R.fig_steps_grid([(f"Step {s}", run.metrics(s)) for s in _pick(steps, 6)], "run",
                                f"Gradient norm vs reward std across steps — run {run.name}")
        parts.append(_img(grid, dpi, "The paper-style grid (rlgrad plot-steps): one row per analysis step."))
    if len(shown) < len(steps):
        parts.append(f'<p class="muted">Figures below for steps {", ".join(map(str, shown))}; '
                     f"<code>rlgrad plot {html.escape(run.source)}</code> draws every step.</p>")
    for s in shown:
        figs = step_figures(run, s)
        is_open = " open" if s == shown[-1] else ""
        parts.append(f"<details{is_open}><summary>Step {s}</summary>")
        parts.append(_bucket_table(run, s))
        parts.append(_samples_block(run, s))
        if s in zero:
            figs = {n: f for n, f in figs.items() if n not in BUCKET_FIGURES}
        # one figure per question in view (which buckets push; how components pull; which neurons sleep), the
        # rest of RAGEN's per-step figures folded
        for name in [n for n in MAIN_STEP_FIGURES if n in figs]:
            parts.append(_img(figs[name], dpi, f"step {s}: {name.replace('_', ' ')}"))
        rest = [n for n in figs if n not in MAIN_STEP_FIGURES]
        if rest:
            parts.append(f"<details><summary>more figures of step {s}: {', '.join(n.replace('_', ' ') for n in rest)}"
                         "</summary>" + "".join(_img(figs[n], dpi, f"step {s}: {n.replace('_', ' ')}") for n in rest)
                         + "</details>")
        parts.append("</details>")
    parts.append("</section>")
    return "".join(parts)


def _per_sample_section(run: D.RunData, dpi: int) -> str:
    """The last ``analysis.per_sample`` step's per-sample norms against advantage and reward std (``samples.jsonl``;
    no section without one)."""
    steps = D.per_sample_steps(run)
    fig = fig_per_sample(D.per_sample_rows(run, steps[-1]), f"Per-sample gradients — run {run.name}, step "
                         f"{steps[-1]}") if steps else None
    if fig is None:
        return ""
    cmd = f"rlgrad samples {html.escape(run.source)} --step {steps[-1]} --by grad-norm"
    return ('<section id="per_sample"><h2>Per-sample gradients</h2>'
            f'<p class="muted">Per-sample analysis steps: {", ".join(map(str, steps))}. ||g_i|| is sample i\'s '
            "exact contribution to the step's task gradient (docs/noise_scale.md); <code>" + cmd + "</code> lists "
            "the samples that carry the most of it.</p>" + _noise_scale_line(run)
            + _img(fig, dpi, f"step {steps[-1]}: per-sample task norm against |advantage| (colour: the prompt "
                             "group's reward std) and by reward-variance bucket.") + "</section>")


def _noise_scale_line(run: D.RunData) -> str:
    """The run's noise scale as the doctor pools it: the figure with its interval, or "unresolved"."""
    got = noise_scale(View(run))
    if got is None:
        return ""
    if not math.isfinite(got.scale):
        said = (f"unresolved: over {got.steps} analysed step(s) the gradient's |G|² is not told apart from 0 "
                "(its 95% interval reaches 0), so the batch's noise could be any multiple of its signal")
    else:
        said = f"{html.escape(got.interval())}, pooled over {got.steps} analysed step(s)"
    return (f"<p>Noise scale (task term, batch grown by prompts at this rollout.n): {said}; "
            f"{fmt(got.samples)} samples per step.</p>")


def _components_section(run: D.RunData, dpi: int) -> str:
    trend = R.fig_reward_components(run)
    # steps without a gradient analysis; the others are drawn with their analysis step
    csteps = [s for s in D.component_steps(run) if s not in D.analysis_steps(run)]
    if trend is None and not D.component_steps(run):
        return ""
    parts = ['<section id="rewards"><h2>Reward components</h2>',
             '<p class="muted">Over the samples the actor update trained on: after the rollout filter, when one is '
             'set (the console\'s <code>acc</code> and <code>reward</code> are over every sample, before it).</p>',
             terms_block("rewards") if D.component_steps(run) else "",
             _img(trend, dpi, "Reward components over training.")]
    pulls = R.fig_component_trend(run)
    if pulls is not None:
        parts.append(_img(pulls, dpi, "Gradient cosine of each pair and each component's share of the update, "
                                      "at every reward-component step."))
    rc = D.reward_components(run)
    if rc:
        last = rc[max(rc)]
        rows = [[D.label(run, c), last.get("weights", {}).get(c, math.nan),
                 *(last.get("stats", {}).get(c, {}).get(k, math.nan) for k in ("mean", "std", "min", "max"))]
                for c in last.get("components", [])]
        parts.append(f"<h3>Step {max(rc)}</h3>"
                     + _table(["component", "weight", "mean", "std", "min", "max"], rows))
    for s in _pick(csteps, 2):
        geom = D.component_geometry(run, s)
        if geom:
            fig = R.fig_components(geom, f"Reward-component gradient geometry — run {run.name}, step {s}")
            parts.append(_img(fig, dpi, f"step {s}: component gradients"))
    if D.component_steps(run) and not csteps:
        parts.append('<p class="muted">Component-gradient geometry is drawn with each analysis step '
                     'above.</p>')
    parts.append("</section>")
    return "".join(parts)


def _neurons_section(run: D.RunData, dpi: int, max_steps: int) -> str:
    trend = R.fig_neuron_trend(run)
    nsteps = D.neuron_steps(run)
    if trend is None and not nsteps:
        return ""
    parts = ['<section id="neurons"><h2>Neuron health</h2>', terms_block("neurons"),
             _img(trend, dpi, "Neuron statistics over training.")]
    if nsteps and nsteps[-1] in _pick(D.analysis_steps(run), max_steps):
        # that step's per-layer figure is drawn with its analysis step above: one figure once
        parts.append(f'<p class="muted">Per layer at step {nsteps[-1]}: under <a href="#analysis">Gradient '
                     f"analysis</a>, step {nsteps[-1]}.</p>")
    elif nsteps:
        h = D.neuron_health(run, nsteps[-1])
        if h:
            parts.append(_img(R.fig_neurons(h, f"Neuron health — run {run.name}, step {nsteps[-1]}"), dpi,
                              f"step {nsteps[-1]}: per layer"))
    parts.append("</section>")
    return "".join(parts)


def build_report(run: D.RunData, dpi: int = 90, max_steps: int = 6, out: Path | None = None) -> str:
    """The HTML page; ``max_steps`` analysis steps (evenly spaced, the last included) get their full
    figures. ``out``: where it will be written (default ``RUN/report.html``), which its links are relative to."""
    steps = [s for s in run.rows if s > 0]
    sections = [
        _config_section(run),
        _section("curves", "Training curves", _img(R.fig_training_curves(run), dpi,
                                                  "Training metrics per step (validation where it ran).")),
        _analysis_section(run, dpi, max_steps),
        _per_sample_section(run, dpi),
        _components_section(run, dpi),
        _neurons_section(run, dpi, max_steps),
        _section("critic", "Critic", _img(R.fig_critic(run), dpi, "Value function.")),
    ]
    page_dir = out.parent if out is not None else run.run_dir
    sections.append(terms_section([sid for sid in ("analysis", "rewards", "neurons")
                                   if any(f'id="{sid}"' in s and 'class="terms"' in s for s in sections)], page_dir))
    reading = "".join(f"<li>{html.escape(t)}</li>" for t in narrative(run))
    diagnosis = _diagnosis_section(run)
    nav = " ".join(f'<a href="#{sid}">{title}</a>' for sid, title in (
        ("diagnosis", "Diagnosis"), ("reading", "What changed"), ("config", "Configuration"),
        ("curves", "Training curves"), ("analysis", "Gradient analysis"), ("per_sample", "Per-sample gradients"),
        ("rewards", "Reward components"),
        ("neurons", "Neuron health"), ("critic", "Critic"), ("terms", "Terms"))
        if sid in ("diagnosis", "reading") or any(f'id="{sid}"' in s for s in sections))
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
{_progress_note(run)}<nav>{nav}</nav>
{diagnosis}
<section id="reading"><h2>What changed</h2><ul class="reading">{reading}</ul></section>
{''.join(sections)}
</main></body></html>
"""


def _progress_note(run: D.RunData) -> str:
    """At the top of the page of a run short of its last step: that the page shows part of a run."""
    if (at := D.unfinished(run)) is None:
        return ""
    return (f'<p class="finding warn"><b>in progress: step {at[0]} of {at[1]}</b> — the run has not reached '
            "trainer.total_training_steps (still training, or stopped: the same command resumes it); this page "
            f"shows its first {at[0]} steps.</p>\n")


def _diagnosis_section(run: D.RunData) -> str:
    """``rlgrad doctor``'s findings, most serious first. A warning or a critical finding is shown whole; an info
    finding is one line (title and first evidence) with the rest folded, so the page's first screen goes to what
    needs attention and to what changed."""
    d = diagnose(run)
    items = []
    for f in d.findings:
        at = f" · from step {f.step}" if f.step is not None else ""
        head = (f"<b>{f.severity.upper()}</b> · {html.escape(f.title)}"
                f'<span class="muted"> ({f.id}{at})</span>')
        evidence = "".join(f"<li>{html.escape(e)}</li>" for e in f.evidence)
        cause = f'<p class="muted">Explained by {f.cause} (above).</p>' if f.cause else ""
        body = (f"{cause}<ul>{evidence}</ul><p>{html.escape(f.explanation)}</p>"
                f"<p><i>What to do:</i> {html.escape(f.action)}</p>")
        if f.severity == "info":
            first = f" — {html.escape(f.evidence[0])}" if f.evidence else ""
            items.append(f'<details class="finding info"><summary>{head}{first}</summary>{body}</details>')
        else:
            items.append(f'<div class="finding {f.severity}">{head}{body}</div>')
    return (f'<section id="diagnosis"><h2>Diagnosis</h2>{"".join(items)}'
            f'<details><summary class="muted">About the gradient-norm scale</summary>'
            f'<p class="muted">{html.escape(d.scale)}</p></details></section>')


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{title}</h2>{body}</section>' if body else ""


def report_command(run_dir: str, output: str | None, dpi: int = 90, max_steps: int = 6) -> int:
    run = D.load_run(run_dir)
    out = check_output(output, run.run_dir) if output else run.run_dir / "report.html"
    if out.is_dir():
        raise UserError(f"--output '{out}' is a directory; give a file name")
    atomic_write_text(out, build_report(run, dpi, max_steps, out))
    at = D.unfinished(run)
    print(f"report written to {out.resolve()}" + (f" (in progress: step {at[0]} of {at[1]})" if at else ""))
    return 0
