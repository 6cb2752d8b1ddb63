"""``rlgrad`` command line. Bad input exits with status 2 and one line naming the culprit."""

from __future__ import annotations

import argparse
import sys

from rlgrad.errors import UserError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-name", help="preset under configs/ (e.g. demo, math_grpo_components)")
    p.add_argument("--config", dest="config_file", help="a YAML config file")
    p.add_argument("overrides", nargs="*", help="key=value overrides, verl style (trainer.total_training_steps=20)")


def cmd_train(args: argparse.Namespace) -> int:
    from rlgrad.config import load_config

    cfg = load_config(args.config_name, args.config_file, args.overrides)  # before the heavy imports: fast errors
    from rlgrad import distributed
    from rlgrad.rl.trainer import RunStopped, Trainer

    distributed.setup(cfg)  # torchrun: join the process group (a no-op in one process)
    try:
        trainer = Trainer(cfg)
        try:
            summary = trainer.fit()
        except RunStopped as e:
            if trainer.is_main:
                print(f"rlgrad: run stopped: {e}", file=sys.stderr)
            return 1
    finally:
        distributed.teardown()
    if not trainer.is_main:
        return 0
    before, after = summary.get("val/accuracy_before"), summary.get("val/accuracy_after")
    print()
    if before is not None and after is not None:
        print(f"validation accuracy: before {100 * before:.1f}%  after {100 * after:.1f}%  "
              f"({100 * (after - before):+.1f} points)")
    elif after is not None:
        print(f"validation accuracy: {100 * after:.1f}%")
    print(f"run directory: {trainer.run_dir}")
    print(f"  metrics: {trainer.run_dir / 'metrics.jsonl'}")
    keep = [o for o in args.overrides if not o.startswith(("trainer.default_local_dir=", "trainer.total_training_steps="))]
    preset = f"--config-name {args.config_name} " if args.config_name else ""
    print("next: continue this run with\n"
          f"  rlgrad train {preset}{' '.join(keep)} trainer.default_local_dir={trainer.run_dir} "
          "trainer.total_training_steps=<more steps>")
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse would print the usage too)
        self.exit(2, f"rlgrad: error: {message} (see rlgrad {self.prog.split()[-1]} --help)\n")


def cmd_probe(args: argparse.Namespace) -> int:
    """The seeds' checkpoint probe: reload global_step_N, run one analysis pass, exit."""
    import time
    from pathlib import Path

    from rlgrad.config import load_config
    from rlgrad.rl.checkpoint import checkpoint_step

    ckpt = Path(args.resume_from_path)
    if not ckpt.is_dir():
        raise UserError(f"--resume-from-path '{ckpt}' does not exist")
    step = checkpoint_step(ckpt)
    run_cfg = ckpt.parent / "config.yaml"
    name = f"{ckpt.parent.name}_probe_step{step}_{time.strftime('%Y%m%d-%H%M%S')}"
    forced = [
        "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}",
        "trainer.gradient_analysis_mode=true", "trainer.gradient_analysis_every=1",
        "trainer.exit_after_gradient_analysis=true", "trainer.gradient_analysis_only=true",
        f"trainer.total_training_steps={step + 1}", f"trainer.val_before_train={str(args.with_val).lower()}",
        "trainer.test_freq=-1", "trainer.save_freq=-1", f"trainer.experiment_name={name}",
        f"trainer.default_local_dir={ckpt.parent.parent / name}",
    ]
    cfg = load_config(args.config_name, args.config_file, forced + args.overrides,
                      base_file=str(run_cfg) if run_cfg.is_file() else None)
    from rlgrad import distributed
    from rlgrad.rl.trainer import Trainer

    distributed.setup(cfg)
    try:
        trainer = Trainer(cfg)
        trainer.fit()
    finally:
        distributed.teardown()
    if not trainer.is_main:
        return 0
    print(f"\nprobe of {ckpt} (step {step}) written to {trainer.run_dir}")
    print(f"  metrics: {trainer.run_dir / 'metrics.jsonl'}   per-layer norms: {trainer.run_dir / 'analysis'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlgrad", description="Gradient-level analysis of RL fine-tuning of LMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("train", help="train a policy (GRPO / RLOO advantages, PPO / CISPO loss)")
    _add_config_args(p)
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("probe", help="reload a checkpoint, run one gradient-analysis pass, exit")
    p.add_argument("--resume-from-path", required=True, help="a global_step_N checkpoint directory")
    p.add_argument("--with-val", action="store_true", help="validate before the probe")
    p.add_argument("--config-name", default="grad_analysis_probe",
                   help="preset applied over the run's own config.yaml (default: grad_analysis_probe)")
    p.add_argument("--config", dest="config_file", help="a YAML config file applied after the preset")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    p.set_defaults(func=cmd_probe)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        # Under torchrun: rank 0 prints an error every rank shares (marked silent elsewhere); another rank
        # prints its own with its rank; before the process group exists only rank 0 speaks.
        from rlgrad import distributed

        r = distributed.env_rank()
        if not getattr(e, "silent", False) and (r == 0 or distributed.was_setup()):
            print(f"rlgrad: error: {f'rank {r}: ' if r else ''}{e}", file=sys.stderr)
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
