"""User-facing errors: the CLI prints ``rlgrad: error: <message>`` and exits with status 2."""

# A run's exit status when the live doctor stopped it (doctor.halt_on): neither success (0), failure (1), bad input (2)
# nor a signal (128 + n). rlgrad train and python -m rlgrad.integrations.verl_main exit with it.
HALTED_STATUS = 3


class UserError(Exception):
    """Bad input from the user (config, override, data, model path, run directory)."""
