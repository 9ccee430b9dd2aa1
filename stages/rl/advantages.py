"""Advantage estimators and reward shaping (OpenRLHF's math), as pure functions on tensors.

Responses come group-contiguous: rows `[i*n, (i+1)*n)` are the `n` samples of prompt `i`.
Token tensors are `[batch, actions]` with `mask` 1 on the response tokens that count.

The estimators are declared in `configs/estimators.py` (`ESTIMATORS[name]`: whether it needs a
critic, whether it compares samples within a group, whether OpenRLHF whitens its advantages over the
whole batch) and each names its score shaping here, in `SHAPINGS`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from configs.estimators import ESTIMATORS
from stages.data.tokenization import last_token_index
from stages.rl.losses import masked_mean


def _groups(scores: torch.Tensor, n: int) -> torch.Tensor:
    if scores.numel() % n:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {n}")
    return scores.view(-1, n)


def unchanged(scores: torch.Tensor, n: int) -> torch.Tensor:
    return scores


def rloo_baseline(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Each sample minus the mean of the other n-1 samples of its prompt (leave-one-out)."""
    g = _groups(scores, n)
    baseline = (g.sum(-1, keepdim=True) - g) / (n - 1)
    return (g - baseline).flatten()


def group_mean_baseline(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Each sample minus its group's mean (REINFORCE++-baseline, Dr. GRPO)."""
    g = _groups(scores, n)
    return (g - g.mean(-1, keepdim=True)).flatten()


def group_normalized(scores: torch.Tensor, n: int) -> torch.Tensor:
    """GRPO: (score - group mean) / (group std + 1e-9), std with Bessel's correction as in OpenRLHF."""
    g = _groups(scores, n)
    return ((g - g.mean(-1, keepdim=True)) / (g.std(-1, keepdim=True) + 1e-9)).flatten()


# (scores [B], n) -> shaped scores [B], by the name an estimator gives as its `shaping`
SHAPINGS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "none": unchanged,
    "leave_one_out": rloo_baseline,
    "group_mean": group_mean_baseline,
    "group_norm": group_normalized,
}


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float) -> torch.Tensor:
    """DAPO's soft penalty: 0 up to `max_len - buffer_len` tokens, then falling linearly to -factor at `max_len`."""
    excess = lengths.float() - (max_len - buffer_len)
    return (-excess / buffer_len * factor).clamp(max=0.0)


def stop_properly_penalty(scores: torch.Tensor, truncated: torch.Tensor, coef: float) -> torch.Tensor:
    """ProRL's penalty on a response cut at the length limit (`truncated`, no end token): its reward times
    `coef` for 0 <= coef <= 1, or `coef` itself for coef < 0 (a fixed negative reward); others unchanged."""
    if coef > 1:
        raise ValueError(f"stop_properly_penalty_coef must be in [0, 1] or negative, got {coef}")
    penalized = scores * coef if coef >= 0 else torch.full_like(scores, coef)
    return torch.where(truncated, penalized, scores)


def groups_in_range(scores: torch.Tensor, n: int, low: float, high: float) -> torch.Tensor:
    """[n_groups] bool: groups whose mean score lies strictly between `low` and `high` (OpenRLHF's
    dynamic_filtering_range; for 0/1 scores, (0, 1) keeps the groups that are neither all right nor all wrong)."""
    mean = _groups(scores, n).mean(-1)
    return (mean > low) & (mean < high)


def varied_groups(scores: torch.Tensor, n: int, eps: float = 1e-6) -> torch.Tensor:
    """[n_groups] bool: groups whose scores are not all equal (DAPO dynamic sampling keeps only these,
    since a group of equal scores has zero advantage under every group estimator)."""
    g = _groups(scores, n)
    return (g.max(-1).values - g.min(-1).values) > eps


def token_rewards(
    scores: torch.Tensor,
    mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    dense: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token rewards: the (shaped) sequence score on the last valid token, plus `dense` rewards
    (e.g. process-reward step scores placed on step-end tokens), minus `kl_coef * kl` on every token."""
    rewards = torch.zeros_like(mask, dtype=torch.float32)
    rewards.scatter_(1, last_token_index(mask).unsqueeze(1), scores.float().unsqueeze(1))
    if dense is not None:
        rewards = rewards + dense.float()
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.float()
    return rewards * mask


def cumulative_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """returns[t] = r[t] + gamma * returns[t+1] over the valid tokens (REINFORCE-style advantages)."""
    rewards = rewards * mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; returns (advantages, returns = advantages + values)."""
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else 0.0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        advantages[:, t] = last
    return advantages, advantages + values


def whiten(advantages: torch.Tensor, mask: torch.Tensor, std_norm: bool = True) -> torch.Tensor:
    """(A - mean) / std over all valid tokens of the batch; only the mean is removed when `std_norm` is off."""
    mean = masked_mean(advantages, mask)
    centered = advantages - mean
    if std_norm:
        var = masked_mean(centered.pow(2), mask)
        centered = centered * var.clamp(min=1e-8).rsqrt()
    return centered * mask


def compute_advantages(
    estimator: str,
    scores: torch.Tensor,
    mask: torch.Tensor,
    n_samples: int,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    dense: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    std_norm: bool = True,
    reward_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) for a batch: shape the scores (a group estimator's baseline), clip them to
    [-reward_clip, reward_clip], spread them over tokens with the KL penalty, accumulate (GAE with a
    critic, discounted returns without), whiten where OpenRLHF does. A group estimator's returns are
    undiscounted (gamma 1, as OpenRLHF forces)."""
    est = ESTIMATORS[estimator]
    if est.grouped and gamma != 1.0:
        raise ValueError(f"estimator {estimator} compares whole responses: gamma must be 1, got {gamma}")
    shaped = SHAPINGS[est.shaping](scores.float(), n_samples)
    if reward_clip is not None:
        shaped = shaped.clamp(-reward_clip, reward_clip)
    rewards = token_rewards(shaped, mask, kl, kl_coef, dense)
    if est.needs_critic:
        if values is None:
            raise ValueError(f"estimator {estimator} needs critic values")
        advantages, returns = gae(rewards, values.float(), mask, gamma, lam)
    else:
        returns = cumulative_returns(rewards, mask, gamma)
        advantages = returns
    if est.whiten:
        advantages = whiten(advantages, mask, std_norm)
    return advantages.detach(), returns.detach()
