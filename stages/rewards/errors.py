"""The user-facing error of the reward sources (declared with the others in configs.errors, so the
flow's driver can check a reward file without importing the sources and torch)."""

from configs.errors import RewardError

__all__ = ["RewardError"]
