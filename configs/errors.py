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


class RewardError(PipelineError):
    """A reward source is misconfigured, unreachable, or returned something unusable."""


def first_line(exc: BaseException) -> str:
    """An exception's message cut to one line, for one-line errors."""
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__
