"""The one error the command turns into a single line on stderr and a non-zero exit."""


class DiagnoseError(Exception):
    """Bad input, or an engine that cannot serve the checkpoint: the message is the whole story."""
