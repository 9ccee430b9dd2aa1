"""Pure loss functions of the RL stage (OpenRLHF's math), on `[batch, actions]` tensors.

`mask` marks the response tokens (actions) that count: 1 up to and including EOS, 0 on padding.
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]
LossAggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (over everything, or along `dim`)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: LossAggregation, max_len: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    token_mean: every valid token of the batch weighs the same (OpenRLHF/DAPO token-level loss).
    seq_mean_token_mean: mean per sequence, then over sequences (the original GRPO).
    seq_mean_token_sum_norm: per-sequence sum divided by a constant `max_len`, then the mean over
    sequences (Dr. GRPO: no length normalisation bias).
    """
    if mode == "token_mean":
        return masked_mean(loss, mask)
    if mode == "seq_mean_token_mean":
        return masked_mean(loss, mask, dim=-1).mean()
    if mode == "seq_mean_token_sum_norm":
        if not max_len:
            raise ValueError("seq_mean_token_sum_norm needs max_len")
        return ((loss * mask).sum(-1) / max_len).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}")


def approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probs (Schulman's k1/k2/k3)."""
    log_ratio = log_probs.float() - ref_log_probs.float()
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return log_ratio.pow(2) / 2
    if estimator == "k3":
        neg = (-log_ratio).clamp(-10, 10)  # the exponent would overflow on far-off tokens
        return neg.exp() - 1 - neg
    raise ValueError(f"unknown KL estimator {estimator!r}")


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: LossAggregation = "token_mean",
    max_len: int | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with separate low/high epsilon (DAPO's clip-higher) and optional dual clip.

    `is_weights` (optional) multiplies the per-token loss: the truncated importance weights of the
    trainer's old log-probs against the rollout engine's. Returns (loss, clip fraction).
    """
    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * advantages
    clipped = torch.min(surr1, surr2)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        # for negative advantages the objective is bounded below by dual_clip * A (Ye et al., 2020)
        clipped = torch.where(advantages < 0, torch.max(clipped, dual_clip * advantages), clipped)
    loss = -clipped
    if is_weights is not None:
        loss = loss * is_weights
    clip_frac = masked_mean((surr2 < surr1).float(), mask)
    return aggregate(loss, mask, aggregation, max_len), clip_frac


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None = 0.2,
) -> torch.Tensor:
    """0.5 * masked mean of the squared error, pessimistic over the clipped and unclipped value."""
    if clip_eps is None:
        return 0.5 * masked_mean((values - returns).pow(2), mask)
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    loss = torch.max((clipped - returns).pow(2), (values - returns).pow(2))
    return 0.5 * masked_mean(loss, mask)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the softmax over the vocabulary."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each label under `logits / temperature` (the sampling distribution)."""
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def truncated_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_old / pi_rollout, cap): corrects for the rollout engine sampling from slightly different
    numbers than the trainer computes (TIS)."""
    return (old_log_probs - rollout_log_probs).exp().clamp(max=cap).detach()


class AdaptiveKLController:
    """The KL coefficient moves toward a target KL (Ziegler et al., 2019): proportional error clipped to
    +-0.2, scaled by steps/horizon."""

    def __init__(self, init_coef: float, target: float, horizon: int):
        self.value, self.target, self.horizon = init_coef, target, horizon

    def update(self, current_kl: float, n_steps: int) -> float:
        error = max(-0.2, min(0.2, current_kl / self.target - 1))
        self.value *= 1 + error * n_steps / self.horizon
        return self.value


class FixedKLController:
    def __init__(self, init_coef: float):
        self.value = init_coef

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.value
