"""TRL's console with rlgrad's instruments: TRL's own log line, and rlgrad's findings as one line.

transformers prints every ``Trainer.log`` through its console callback: ``ProgressCallback`` (a tqdm bar; its
``on_log`` writes the whole log dict) or, with ``args.disable_tqdm``, ``PrinterCallback`` (``print(logs)``). At an
analysed step rlgrad's keys would make that line a dict of a hundred-odd entries. ``use_summary_console`` swaps
the trainer's console callback, through the trainer's documented ``pop_callback`` / ``add_callback``, for the same
class with one change to ``on_log``: rlgrad's keys are left out of the printed dict and
``rlgrad.logging.sinks.analysis_summary`` (the line ``rlgrad train`` prints) follows it. Only what is printed
changes: ``state.log_history`` and every other callback (the ``report_to`` loggers, rlgrad's own) get the whole
log. A notebook's console (``NotebookProgressCallback``) is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import PrinterCallback, ProgressCallback

from rlgrad.logging.sinks import analysis_summary

# What the console replaces: (the analysed step, rlgrad's keys in the log being printed) -- () when none.
Shown = Callable[[], tuple[int, dict[str, float]] | tuple[()]]


class _SummaryConsole:
    """``on_log`` of a transformers console callback (the class after this one in the MRO) without rlgrad's keys,
    then rlgrad's one-line summary of them."""

    def __init__(self, shown: Shown, **kwargs):
        super().__init__(**kwargs)
        self.shown = shown

    def on_log(self, args, state, control, logs=None, **kwargs):
        found = self.shown()
        if not found or logs is None:
            return super().on_log(args, state, control, logs=logs, **kwargs)
        step, ours = found
        super().on_log(args, state, control, logs={k: v for k, v in logs.items() if k not in ours}, **kwargs)
        line = analysis_summary(step, ours)
        if line and state.is_world_process_zero:
            self.write(line)

    def write(self, line: str) -> None:
        print(line)


class SummaryProgressCallback(_SummaryConsole, ProgressCallback):
    """transformers' ``ProgressCallback`` (the tqdm bar) with rlgrad's keys as one line."""

    def write(self, line: str) -> None:
        if self.training_bar is not None:
            self.training_bar.write(line)  # above the bar, as the bar writes TRL's line
        else:
            print(line)


class SummaryPrinterCallback(_SummaryConsole, PrinterCallback):
    """transformers' ``PrinterCallback`` (``args.disable_tqdm``) with rlgrad's keys as one line."""


def use_summary_console(trainer, shown: Shown) -> None:
    """Swap ``trainer``'s console callback for its summarising twin (module docstring); a trainer without one (a
    user removed it) is left without one."""
    for plain, ours in ((ProgressCallback, SummaryProgressCallback), (PrinterCallback, SummaryPrinterCallback)):
        old = trainer.pop_callback(plain)
        if old is not None:
            kwargs = {"max_str_len": old.max_str_len} if isinstance(old, ProgressCallback) else {}
            trainer.add_callback(ours(shown, **kwargs))
