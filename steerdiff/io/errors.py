"""The error every reader of files raises for input it cannot trust or parse."""


class CheckpointError(ValueError):
    """A checkpoint or data file that cannot be read safely or does not match its config."""
