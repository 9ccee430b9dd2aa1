"""The reward model's loss: Bradley-Terry on the scores of a preference pair."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pairwise_loss(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None) -> torch.Tensor:
    """Bradley-Terry: mean of -log sigmoid(r_chosen - r_rejected - margin)."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff).mean()
