"""``rlgrad`` command line. Bad input exits with status 2 and one line naming the culprit."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from rlgrad.errors import UserError
from rlgrad.runfiles import ANALYSIS_DIR, CONFIG_FILE, METRICS_FILE


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-name", help="preset under configs/ (e.g. demo, math_grpo_components)")
    p.add_argument("--config", dest="config_file", help="a YAML config file")
    p.add_argument("overrides", nargs="*", help="key=value overrides, verl style (trainer.total_training_steps=20)")


def cmd_train(args: argparse.Namespace) -> int:
    from rlgrad.config.load import load_config
    from rlgrad.config.schema import documented_yaml

    cfg = load_config(args.config_name, args.config_file, args.overrides)  # before the heavy imports: fast errors
    if args.show_config:
        print(documented_yaml(cfg), end="")
        return 0
    from rlgrad import distributed
    from rlgrad.recipes import make_trainer
    from rlgrad.rl.resume import RunStopped

    distributed.check_process_count(cfg.trainer)
    distributed.setup(cfg)  # torchrun: join the process group (a no-op in one process)
    try:
        trainer = make_trainer(cfg)
        try:
            summary = trainer.fit()
        except RunStopped as e:  # a signal (128 + its number), the doctor (doctor.halt_on: 3), another stop (1)
            if trainer.is_main:
                print(f"rlgrad: {e.label}{e}", file=sys.stderr)
            return e.status
    finally:
        distributed.teardown()
    if not trainer.is_main:
        return 0
    before, after = summary.get("val/accuracy_before"), summary.get("val/accuracy_after")
    print()
    if before is not None and after is not None and not math.isnan(before):
        print(f"validation accuracy: before {100 * before:.1f}%  after {100 * after:.1f}%  "
              f"({100 * (after - before):+.1f} points)")
    elif after is not None:
        print(f"validation accuracy: {100 * after:.1f}% (no validation before training"
              + (": trainer.val_before_train=false)" if not cfg.trainer.val_before_train else ")"))
    print(f"run directory: {trainer.run_dir}")
    print(f"  metrics: {trainer.run_dir / METRICS_FILE}")
    keep = [o for o in args.overrides
            if not o.startswith(("trainer.default_local_dir=", "trainer.total_training_steps="))]
    preset = f"--config-name {args.config_name} " if args.config_name else ""
    prog = invoked_as()
    print(f"next:\n  {prog} report {trainer.run_dir}      # one HTML page: curves, analyses, diagnosis\n"
          f"  {prog} doctor {trainer.run_dir}      # is the run healthy?\n"
          f"  {prog} train {preset}{' '.join(keep)} trainer.default_local_dir={trainer.run_dir} "
          "trainer.total_training_steps=<more steps>      # continue it")
    if prog != "rlgrad":
        print(f"  (or `source {Path(prog).parent}/activate` once, then plain `rlgrad ...`)")
    return 0


def invoked_as(argv0: str | None = None) -> str:
    """How to type this command again in the same shell: ``rlgrad`` when that name on PATH is this very script,
    else the path it was started by (``.venv/bin/rlgrad`` from scripts/demo.sh, whose venv is not activated)."""
    import shutil

    argv0 = sys.argv[0] if argv0 is None else argv0
    if Path(argv0).name != "rlgrad" or os.sep not in argv0:
        return "rlgrad"  # typed as `rlgrad` (found on PATH), or python -m rlgrad, or called in-process
    on_path = shutil.which("rlgrad")
    if on_path and Path(on_path).resolve() == Path(argv0).resolve():
        return "rlgrad"
    return argv0


def _width() -> int:
    """The width help text is wrapped to: the terminal's, within 60..120 columns."""
    import shutil

    return min(max(shutil.get_terminal_size((100, 24)).columns, 60), 120)


def first_sentence(text: str) -> str:
    """``text`` up to the end of its first sentence: a '.', '!' or '?' outside parentheses followed by a space and
    a capital or a backquote ("et al. 2025" and "e.g. 9" go on); the whole text when it has one sentence."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if c in ".!?" and depth == 0 and text[i + 1:i + 2] == " " and (text[i + 2:i + 3].isupper()
                                                                       or text[i + 2:i + 3] == "`"):
            return text[:i + 1]
    return text


def _presets_epilog() -> str:
    import textwrap

    from rlgrad.config.load import presets

    pad = " " * 36
    rows = [textwrap.fill(first_sentence(about), _width(), initial_indent=f"  {name:<33} ", subsequent_indent=pad,
                          break_on_hyphens=False) for name, about in presets()]
    head = textwrap.fill("presets (--config-name NAME), each with the first sentence of what it is for (rlgrad "
                         "presets: the whole description):", _width())
    tail = textwrap.fill("every setting, its default and its meaning: rlgrad train [--config-name NAME] [overrides] "
                         "--show-config", _width(), break_on_hyphens=False)
    return head + "\n" + "\n".join(rows) + "\n\n" + tail


def cmd_presets(args: argparse.Namespace) -> int:
    import textwrap

    from rlgrad.config.load import presets

    for name, about in presets():
        print(name)
        print(textwrap.fill(about, _width(), initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False))
    print("\n" + textwrap.fill("use one with: rlgrad train --config-name NAME [key=value ...]  (--show-config: its "
                               "resolved settings)", _width(), break_on_hyphens=False))
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse would print the usage too)
        sub = self.prog.split()[1:]  # "rlgrad" or "rlgrad train": the help of the command that failed
        self.exit(2, f"rlgrad: error: {message} (see rlgrad {' '.join(sub + ['--help'])})\n")


def cmd_probe(args: argparse.Namespace) -> int:
    """RAGEN's checkpoint probe: reload global_step_N, analyse the batch of step N+1, write, exit."""
    import time
    from pathlib import Path

    from rlgrad.config.load import load_config
    from rlgrad.rl.checkpoint import checkpoint_step, damage

    ckpt = Path(args.resume_from_path)
    if not ckpt.is_dir():
        raise UserError(f"--resume-from-path '{ckpt}' does not exist")
    step = checkpoint_step(ckpt)
    if why := damage(ckpt):
        raise UserError(f"checkpoint '{ckpt}' is damaged ({why}); probe an earlier global_step_N")
    run_cfg = ckpt.parent / CONFIG_FILE
    name = f"{ckpt.parent.name}_probe_step{step}_{time.strftime('%Y%m%d-%H%M%S')}"
    # Where the probe reads and writes, and RAGEN's probe settings: it ends after the bucket analysis.
    where = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}",
             f"trainer.val_before_train={str(args.with_val).lower()}", f"trainer.experiment_name={name}",
             f"trainer.default_local_dir={ckpt.parent.parent / name}", f"trainer.total_training_steps={step + 1}",
             "trainer.rollout_data_dir=null",  # the probe's own run directory, never the probed run's
             "analysis.buckets.exit_after=true"]
    cfg = load_config(args.config_name, args.config_file, where + args.overrides,
                      base_file=str(run_cfg) if run_cfg.is_file() else None, probe=True)
    from rlgrad import distributed
    from rlgrad.recipes import make_prober
    from rlgrad.rl.resume import RunStopped

    distributed.setup(cfg)
    try:
        prober = make_prober(cfg)
        try:
            prober.probe()
        except RunStopped as e:
            if prober.is_main:
                print(f"rlgrad: probe stopped: {e}", file=sys.stderr)
            return 1
    finally:
        distributed.teardown()
    if not prober.is_main:
        return 0
    print(f"\nprobe of {ckpt} (step {step}) written to {prober.run_dir}")
    print(f"  metrics: {prober.run_dir / METRICS_FILE}   per-layer norms: {prober.run_dir / ANALYSIS_DIR}")
    print(f"next:\n  {invoked_as()} plot {prober.run_dir}      # RAGEN's figures of the probed step")
    return 0


def _check_dpi(dpi: int) -> None:
    if not 10 <= dpi <= 1200:
        raise UserError(f"--dpi {dpi} is outside 10..1200")


def cmd_plot(args: argparse.Namespace) -> int:
    from rlgrad.viz.plot import plot_command

    _check_dpi(args.dpi)
    return plot_command(args.run_dir, args.wandb_path, args.steps, args.output_dir, args.list_steps, args.dpi)


def cmd_plot_steps(args: argparse.Namespace) -> int:
    from rlgrad.viz.plot import plot_steps_command

    _check_dpi(args.dpi)
    return plot_steps_command(args.mode, args.step_dir, args.out, args.dpi)


def cmd_report(args: argparse.Namespace) -> int:
    from rlgrad.viz.report import report_command

    _check_dpi(args.dpi)
    if args.max_steps < 1:
        raise UserError(f"--max-steps {args.max_steps} must be at least 1")
    return report_command(args.run_dir, args.output, args.dpi, args.max_steps)


def cmd_export(args: argparse.Namespace) -> int:
    """Export a run's records in another tool's layout (rewards: rldynamic's all_rewards.json)."""
    from rlgrad.logging.rewards import export_rewards

    out = export_rewards(args.run, args.output, args.format)
    print(f"wrote {out}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from rlgrad.doctor.command import doctor_command

    if args.selftest is not None:
        from rlgrad.doctor.selftest import selftest

        return selftest(args.selftest or None)
    if args.follow:
        from rlgrad.doctor.command import follow_command

        return follow_command(args.run, args.thresholds, args.fail_on, args.interval)
    return doctor_command(args.run, args.wandb_path, args.json, args.explain, args.thresholds, args.fail_on)


def cmd_metrics(args: argparse.Namespace) -> int:
    """The metric catalogue: JSON for other tools (the same document as RUN/metrics_catalogue.json), or Markdown."""
    from rlgrad.metrics import docs_page, to_json

    if args.format == "markdown" and args.keys:
        raise UserError(f"--format markdown prints the whole catalogue (docs/metrics.md); drop the keys "
                        f"{' '.join(args.keys)} or use --format json")
    print(to_json(args.keys) if args.format == "json" else docs_page(), end="")
    return 0


def _steps_text(steps: list[int]) -> str:
    """1, 2, 3, 5, 7, 8, 9 -> '1-3, 5, 7-9'."""
    out, k = [], 0
    while k < len(steps):
        j = k
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[k]) if j == k else f"{steps[k]}-{steps[j]}")
        k = j + 1
    return ", ".join(out)


def _clip(text: str, limit: int) -> str:
    """``text`` at most about ``limit`` characters: its head and tail around a marker (0: whole)."""
    if limit <= 0 or len(text) <= limit:
        return text
    head, tail = text[:2 * limit // 3], text[len(text) - limit // 3:]
    return f"{head} … [{len(text) - len(head) - len(tail)} characters] … {tail}"


def _indented(text: str, pad: str) -> str:
    return "\n".join(pad + line for line in (text.splitlines() or [""]))


def _sample_line(s: dict) -> str:
    comps = "  ".join(f"{c} {v:.3g}" for c, v in (s.get("components") or {}).items() if isinstance(v, int | float))
    adv = s.get("advantage")
    adv_text = f"adv {adv:+.3f}" if isinstance(adv, int | float) else "adv –"
    total = s.get("total")
    total_text = f"total {total:.3f}" if isinstance(total, int | float) else "total –"
    return (f"  #{s.get('index', '?')}  {total_text}  ({comps})  {adv_text}  "
            f"{s.get('finish_reason', '?')}, {s.get('response_length', '?')} tokens")


def _by_grad_norm(args: argparse.Namespace, run, step: int) -> list[str]:
    """``rlgrad samples --by grad-norm``: the step's samples by their per-sample gradient norm (``--term``), largest
    first, each with its share ||g_i||² / Σ_j ||g_j||² of the step's summed squared per-sample norms."""
    from rlgrad import rundata

    rows = rundata.per_sample_rows(run, step)
    if not rows:
        have = rundata.per_sample_steps(run)
        raise UserError(f"step {step} has no per-sample gradient norms (analysis/step_{step}/samples.jsonl; "
                        "analysis.per_sample.every); " + (f"steps with them: {_steps_text(have)}" if have
                                                          else "the run has none"))
    field = f"grad_norm/{args.term}"
    if field not in rows[0]:
        terms = sorted(k.split("/", 1)[1] for k in rows[0] if k.startswith("grad_norm/"))
        raise UserError(f"step {step} has no per-sample norms of term '{args.term}' (terms: {', '.join(terms)})")
    total = sum(float(r[field]) ** 2 for r in rows) or 1.0
    rows.sort(key=lambda r: -float(r[field]))
    limit = 0 if args.full else 400
    lines = [f"{run.source} · step {step}: {len(rows)} analysed samples by per-sample {args.term} gradient norm "
             f"(share: of Σ_i ||g_i||²)"]
    if len(rows) > args.max:
        lines.append(f"showing {args.max} of {len(rows)} samples (--max)")
    for rank, r in enumerate(rows[:args.max], start=1):
        rollout = r.get("rollout") or {}
        reward, advantage = r.get("reward"), r.get("advantage")
        lines += ["", f"{rank}. #{r.get('sample')} · group {r.get('group')} · {r.get('bucket') or '–'} · "
                      f"||g|| {float(r[field]):.4g} · share {float(r[field]) ** 2 / total:.1%} · "
                      f"reward {_num(reward)} · adv {_num(advantage)}",
                  f"  prompt: {_clip(str(rollout.get('prompt', '(no rollout line)')), limit)}",
                  _indented(_clip(str(rollout.get("response", "")), limit) or "(empty response)", "      ")]
    return lines


def _num(x) -> str:
    return f"{x:+.3f}" if isinstance(x, int | float) else "–"


def _samples_step(args: argparse.Namespace, steps: list[int], where) -> int:
    """The step ``rlgrad samples`` shows: ``--step`` (which must have a rollout file) or the last one."""
    if not steps:
        raise UserError(f"'{args.run_dir}' has no rollout files (step_N.jsonl) in {where}")
    step = steps[-1] if args.step is None else args.step
    if step not in steps:
        raise UserError(f"no rollouts for step {step} in {where}; steps with rollouts: {_steps_text(steps)}")
    return step


def _groups_in_bucket(args: argparse.Namespace, run, step: int, steps: list[int], groups: list,
                      buckets: list[str]) -> list:
    """``groups`` in the bucket ``--bucket`` names (bucket_N or N)."""
    from rlgrad import rundata

    want = f"bucket_{args.bucket}" if args.bucket.isdigit() else args.bucket
    if not buckets:
        analysed = [s for s in steps if rundata.group_buckets(run, s)]
        raise UserError(f"step {step} has no bucket analysis of its training batch, so --bucket cannot select "
                        "from it; " + (f"analysed steps with rollouts: {_steps_text(analysed)}" if analysed
                                       else "no step with rollouts was analysed"))
    if want not in buckets:
        raise UserError(f"step {step} has no bucket '{args.bucket}' (buckets: {', '.join(buckets)})")
    return [g for g in groups if g.bucket == want]


def _the_group(args: argparse.Namespace, step: int, groups: list, shown: list) -> list:
    """The prompt group ``--group`` names, among ``shown`` (the groups the bucket left)."""
    if args.group not in {g.group_id for g in groups}:
        ids = [g.group_id for g in groups]
        raise UserError(f"step {step} has no group {args.group} (groups: {_steps_text(ids)})")
    shown = [g for g in shown if g.group_id == args.group]
    if not shown:
        raise UserError(f"group {args.group} of step {step} is not in bucket '{args.bucket}'")
    return shown


def _group_lines(group, limit: int) -> list[str]:
    """A prompt group: its heading, its prompt, and each sample's line and response."""
    head = [f"group {group.group_id}", *([group.bucket] if group.bucket else []),
            f"reward std {group.reward_std:.3f}", "kept" if group.kept else "dropped by the rollout filter"]
    prompt = _clip(group.prompt, 2 * limit)
    if "\n" not in prompt and len(prompt) <= 100:
        prompt_lines = [f"  prompt: {prompt}"]
    else:
        prompt_lines = ["  prompt:", _indented(prompt, "    ")]
    lines = ["", " · ".join(head), *prompt_lines]
    for sample in group.samples:
        text = str(sample.get("response", ""))
        lines += [_sample_line(sample), _indented(_clip(text, limit) if text else "(empty response)", "      ")]
    return lines


def _print_to_pipe(text: str) -> None:
    """Print ``text``; a reader that closes the pipe early (`rlgrad samples RUN | head`) is no error."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def cmd_samples(args: argparse.Namespace) -> int:
    """A step's prompt groups as the model answered them (RUN/rollouts/step_N.jsonl), readable in a terminal."""
    from rlgrad import rundata

    if args.max < 1:
        raise UserError(f"--max {args.max} must be at least 1")
    run = rundata.load_run(args.run_dir)
    steps = rundata.rollout_steps(run)
    step = _samples_step(args, steps, rundata.rollout_dir(run))
    if args.by == "grad-norm":
        _print_to_pipe("\n".join(_by_grad_norm(args, run, step)))
        return 0
    groups = rundata.rollout_groups(run, step)
    buckets = rundata.sort_buckets(g.bucket for g in groups if g.bucket)
    shown = groups
    if args.bucket is not None:
        shown = _groups_in_bucket(args, run, step, steps, groups, buckets)
    if args.group is not None:
        shown = _the_group(args, step, groups, shown)
    n_samples = sum(len(g.samples) for g in groups)
    n_kept = sum(bool(s.get("kept")) for g in groups for s in g.samples)
    limit = 0 if args.full else 400
    lines = [f"{run.source} · step {step}: {n_samples} samples in {len(groups)} prompt groups, {n_kept} kept by the "
             "rollout filter",
             f"buckets (analysis/step_{step}/group_rv_table.csv): {', '.join(buckets)}" if buckets
             else "no bucket analysis of the training batch at this step"]
    if len(shown) > args.max:
        lines.append(f"showing {args.max} of {len(shown)} groups (--max)")
    for group in shown[:args.max]:
        lines += _group_lines(group, limit)
    _print_to_pipe("\n".join(lines))
    return 0


# ----------------------------------------------------------------------------- the parser: one function a command
def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a policy (GRPO / RLOO advantages, PPO / CISPO loss)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_presets_epilog())
    _add_config_args(p)
    p.add_argument("--show-config", action="store_true",
                   help="print the resolved settings (preset and overrides applied) with each one's documentation, "
                        "and exit")
    p.set_defaults(func=cmd_train)


def _presets_parser(sub) -> None:
    p = sub.add_parser("presets", help="the presets --config-name takes, each with what it is for")
    p.set_defaults(func=cmd_presets)


def _probe_parser(sub) -> None:
    p = sub.add_parser("probe", help="reload a checkpoint, run one gradient-analysis pass, exit")
    p.add_argument("--resume-from-path", required=True, help="a global_step_N checkpoint directory")
    p.add_argument("--with-val", action="store_true", help="validate before the probe")
    p.add_argument("--config-name", default="grad_analysis_probe",
                   help="preset applied over the run's own config.yaml (default: grad_analysis_probe)")
    p.add_argument("--config", dest="config_file", help="a YAML config file applied after the preset")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    p.set_defaults(func=cmd_probe)


def _plot_parser(sub) -> None:
    p = sub.add_parser("plot", help="figures, metrics JSON and group table for each gradient-analysis step of a run")
    p.add_argument("run_dir", nargs="?", help="a local run directory or its metrics.jsonl (offline; the default)")
    p.add_argument("--wandb-path", help="read a W&B run instead: ENTITY/PROJECT/RUN_ID (needs network)")
    p.add_argument("--list-steps", action="store_true",
                   help="print the analysis steps (bucket analysis, reward components, neuron health) and exit")
    p.add_argument("--step", dest="steps", type=int, nargs="+", help="steps to plot (default: every analysis step)")
    p.add_argument("--output-dir", help="default: gradient_analysis_outputs/<run name>/")
    p.add_argument("--dpi", type=int, default=150, help="PNG resolution (default 150)")
    p.set_defaults(func=cmd_plot)


def _plot_steps_parser(sub) -> None:
    p = sub.add_parser("plot-steps", help="the paper-style grid: a row per step from exported per-step metrics")
    p.add_argument("--mode", choices=("ppo", "grpo"), default="grpo", help="algorithm named in the title")
    p.add_argument("--step-dir", action="extend", nargs="+", required=True, metavar="STEP=DIR",
                   help="a step and the directory holding its gradient_analysis_metrics_step_<STEP>.json "
                        "(or metrics.json), one per row: --step-dir 1=A 51=B (or repeat the flag)")
    p.add_argument("--out", required=True, help="output PNG file")
    p.add_argument("--dpi", type=int, default=200, help="PNG resolution (default 200)")
    p.set_defaults(func=cmd_plot_steps)


def _report_parser(sub) -> None:
    p = sub.add_parser("report", help="one self-contained HTML report of a run (figures inlined)")
    p.add_argument("run_dir", help="a local run directory (or its metrics.jsonl)")
    p.add_argument("--output", help="default: RUN_DIR/report.html")
    p.add_argument("--dpi", type=int, default=90, help="resolution of the inlined figures (default 90)")
    p.add_argument("--max-steps", type=int, default=6,
                   help="analysis steps drawn in full, evenly spaced, the last included "
                        "(default 6; rlgrad plot draws all)")
    p.set_defaults(func=cmd_report)


def _doctor_parser(sub) -> None:
    p = sub.add_parser("doctor", help="is the run healthy, and why did the gradient do that? "
                                      "(findings, most serious first; exit 1 when one is critical)")
    p.add_argument("run", nargs="?", help="an rlgrad run directory (or its metrics.jsonl), a TRL output directory "
                                          "(trainer_state.json) or verl's file-logger JSONL")
    p.add_argument("--wandb-path", help="read a W&B run instead: ENTITY/PROJECT/RUN_ID (needs network)")
    p.add_argument("--json", action="store_true", help="the findings as JSON on stdout")
    p.add_argument("--explain", action="store_true", help="also list the checks the run lacks the metrics for")
    p.add_argument("--thresholds", help="a YAML file overriding thresholds (rlgrad.doctor.findings.Thresholds)")
    p.add_argument("--fail-on", choices=("warn", "critical", "never"), default="critical",
                   help="exit 1 when a finding is at or above this severity (default critical; never: exit 0)")
    p.add_argument("--follow", action="store_true",
                   help="follow a run being written: print each finding once as it appears, until the run ends "
                        "(an rlgrad run: its writer exits; otherwise 10 minutes without a new step) or Ctrl-C")
    p.add_argument("--interval", type=float, default=2.0, help="--follow: seconds between reads of the run")
    p.add_argument("--selftest", nargs="?", const="", metavar="DIR",
                   help="run the doctor on its recorded runs with known faults (tests/data/doctor, or DIR) and "
                        "print detected / missed for each; exit 1 if one is missed or a healthy run alarms")
    p.set_defaults(func=cmd_doctor)


def _samples_parser(sub) -> None:
    p = sub.add_parser("samples", help="a step's prompt groups and what the model wrote (RUN/rollouts/step_N.jsonl)")
    p.add_argument("run_dir", help="a local run directory (or its metrics.jsonl)")
    p.add_argument("--step", type=int, help="default: the last step with a rollout file")
    p.add_argument("--bucket", help="only groups of this reward-variance bucket (bucket_1 or 1: the lowest; "
                                    "a step the bucket analysis ran at)")
    p.add_argument("--group", type=int, help="only this prompt group (its id)")
    p.add_argument("--max", type=int, default=8, help="at most this many groups (or samples, --by grad-norm; "
                                                         "default 8)")
    p.add_argument("--by", choices=("group", "grad-norm"), default="group",
                   help="group: the prompt groups in order (default); grad-norm: the samples of an analysis.per_sample "
                        "step by their per-sample gradient norm, largest first, with their share of the step's")
    p.add_argument("--term", default="task", help="--by grad-norm: the loss term (default task)")
    p.add_argument("--full", action="store_true",
                   help="whole prompts and responses (default: about 400 characters of each response, "
                        "head and tail)")
    p.set_defaults(func=cmd_samples)


def _export_parser(sub) -> None:
    p = sub.add_parser("export", help="export a run's records (rewards: rldynamic's all_rewards.json layout)")
    p.add_argument("what", choices=["rewards"], help="what to export")
    p.add_argument("run", help="the run directory")
    p.add_argument("--format", default="json", choices=["json"], help="output format (default: json)")
    p.add_argument("--output", help="output file (default: RUN/all_rewards.json)")
    p.set_defaults(func=cmd_export)


def _metrics_parser(sub) -> None:
    p = sub.add_parser("metrics", help="every metric key rlgrad logs, with its meaning, as JSON for other tools "
                                       "(what it is measured on, unit, other tools' names); --format markdown: "
                                       "docs/metrics.md")
    p.add_argument("keys", nargs="*", metavar="KEY",
                   help="only the entries of these keys (concrete, e.g. grad_norm/bucket_1/task, or templates)")
    p.add_argument("--format", default="json", choices=("json", "markdown"), help="output format (default: json)")
    p.set_defaults(func=cmd_metrics)


# In the order `rlgrad --help` lists the commands.
_COMMAND_PARSERS = (_train_parser, _presets_parser, _probe_parser, _plot_parser, _plot_steps_parser,
                    _report_parser, _doctor_parser, _samples_parser, _export_parser, _metrics_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlgrad", description="Gradient-level analysis of RL fine-tuning of LMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add_command in _COMMAND_PARSERS:
        add_command(sub)
    parser.subcommands = sub.choices  # name -> its parser
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand's own parser, so the hint points at its help
        parser.subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except UserError as e:
        # Under torchrun: rank 0 prints an error every rank shares (marked silent elsewhere); another rank
        # prints its own with its rank; before the process group exists only rank 0 speaks.
        from rlgrad import distributed

        rank = distributed.env_rank()
        if not getattr(e, "silent", False) and (rank == 0 or distributed.was_setup()):
            print(f"rlgrad: error: {f'rank {rank}: ' if rank else ''}{e}", file=sys.stderr)
        return 2
    except Exception as e:
        import torch.distributed as dist

        if isinstance(e, dist.DistError) or "gloo" in str(e).lower() or "nccl" in str(e).lower():
            from rlgrad.distributed import failure_message

            print(f"rlgrad: error: {failure_message(e)}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        print("rlgrad: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
