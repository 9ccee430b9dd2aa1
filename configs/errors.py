"""Errors the user can fix: each carries one line naming the culprit and what is expected.

The CLI prints `error: <message>` for these and exits non-zero without a traceback.
"""


class PipelineError(Exception):
    """Base of the user-facing errors."""


class ConfigError(PipelineError):
    """A config file or override is invalid."""


class DataError(PipelineError):
    """A dataset is missing, empty, lacks a column, or has a bad row."""


class CheckpointError(PipelineError):
    """A model path is not a loadable checkpoint."""
