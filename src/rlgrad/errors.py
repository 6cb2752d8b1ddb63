"""User-facing errors: the CLI prints ``rlgrad: error: <message>`` and exits with status 2."""


class UserError(Exception):
    """Bad input from the user (config, override, data, model path, run directory)."""
