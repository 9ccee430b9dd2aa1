"""The process reward model's loss: cross-entropy over the two reward tokens at the step placeholders."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from stages.data.tokenization import IGNORE_INDEX


def step_logits(logits: torch.Tensor, labels: torch.Tensor, reward_ids: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 2) logits of (good, bad) at the labelled placeholder positions, and the target index (0 good, 1 bad)."""
    mask = labels != IGNORE_INDEX
    selected = logits[mask][:, list(reward_ids)].float()
    target = (labels[mask] == reward_ids[1]).long()
    return selected, target


def prm_loss(logits: torch.Tensor, labels: torch.Tensor, reward_ids: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy restricted to the reward tokens at placeholders; also the per-step correctness."""
    selected, target = step_logits(logits, labels, reward_ids)
    return F.cross_entropy(selected, target), (selected.detach().argmax(-1) == target).float()
