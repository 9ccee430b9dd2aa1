"""The user-facing error of the reward sources."""

from configs.errors import PipelineError


class RewardError(PipelineError):
    """A reward source is misconfigured, unreachable, or returned something unusable."""
