"""Pure loss functions of the RL stage (OpenRLHF's math), on `[batch, actions]` tensors.

`mask` marks the response tokens (actions) that count: 1 up to and including EOS, 0 on padding.

Losses over an optimizer step of several micro-batches (and ranks) take `units` (`step_units`): the
step's count of what the aggregation averages over (tokens, or sequences) per micro-batch. A
micro-batch's sum divided by it, averaged by DeepSpeed over the step's micro-batches and ranks, is
the mean over the whole step (OpenRLHF's global token mean), however unevenly the tokens fall into
micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from configs.estimators import LossAggregation

KLEstimator = Literal["k1", "k2", "k3"]
PolicyLossType = Literal["ppo", "gspo"]
ISCorrection = Literal["tis", "icepop", "seq-mask-tis"]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (over everything, or along `dim`)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def loss_units(mask: torch.Tensor) -> torch.Tensor:
    """[tokens, sequences] of a micro-batch: what the aggregations average over (a sequence counts
    when it has a valid token)."""
    mask = mask.float()
    return torch.stack([mask.sum(), (mask.sum(-1) > 0).sum().float()])


def step_units(
    masks: list[torch.Tensor], ranks: int = 1, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """[tokens, sequences] per micro-batch of one optimizer step: the `loss_units` of this rank's
    micro-batches (`masks`), summed over the `ranks` by `reduce` (an all-reduce), over their number."""
    total = torch.stack([loss_units(m) for m in masks]).sum(0)
    if reduce is not None:
        total = reduce(total)
    return total / (len(masks) * ranks)


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggregation,
    max_len: int | None = None,
    units: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    token_mean: every valid token weighs the same (OpenRLHF/DAPO token-level loss).
    seq_mean_token_mean: mean per sequence, then over sequences (the original GRPO; OpenRLHF's
    per-sample loss).
    seq_mean_token_sum_norm: per-sequence sum divided by a constant `max_len`, then the mean over
    sequences (Dr. GRPO: no length normalisation bias).

    The sum is divided by this batch's count of tokens (token_mean) or sequences, or, with `units`
    ([tokens, sequences] per micro-batch of the optimizer step, see the module note), by the step's.
    """
    mask = mask.to(loss.dtype)
    masked = loss * mask
    if mode == "token_mean":
        total = masked.sum()
    elif mode == "seq_mean_token_mean":
        total = (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    elif mode == "seq_mean_token_sum_norm":
        if not max_len:
            raise ValueError("seq_mean_token_sum_norm needs max_len")
        total = masked.sum() / max_len
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}")
    count = (loss_units(mask) if units is None else units)[0 if mode == "token_mean" else 1]
    return total / torch.where(count > 0, count, 1.0)  # nothing to average: the sum is 0, and so is the loss


def approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probs (Schulman's
    k1/k2/k3), clamped to [-10, 10] as OpenRLHF's: beyond it the value is 10 (or -10) and the gradient 0."""
    log_ratio = log_probs.float() - ref_log_probs.float()
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = log_ratio.pow(2) / 2
    elif estimator == "k3":
        # exp(-log_ratio) overflows float32 below a log-ratio of about -88 (inf, and a NaN gradient through
        # the clamp); k3 already reaches the bound 10 below about -2.6, so this floor changes no value
        log_ratio = log_ratio.clamp(min=-10)
        kl = (-log_ratio).exp() - 1 + log_ratio
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}")
    return kl.clamp(-10, 10)


def policy_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor,
                 loss_type: PolicyLossType = "ppo") -> torch.Tensor:
    """The importance ratio the surrogate clips, per token.

    ppo: each token's own ratio. gspo (Zheng et al., 2025): the sequence's, the geometric mean of its tokens'
    ratios (exp of the mean log-ratio over its valid tokens), on every valid token and 0 on padding.
    The log-ratio is clamped to [-20, 20] before `exp`, as OpenRLHF's PPO ratio is (its GSPO ratio is not:
    the two differ only beyond a ratio of e^20, where an unclamped one overflows float32 from about 88 on).
    """
    log_ratio = log_probs - old_log_probs
    if loss_type == "ppo":
        return log_ratio.clamp(-20, 20).exp()
    if loss_type == "gspo":
        seq = masked_mean(log_ratio, mask, dim=-1)
        return seq.clamp(-20, 20).exp().unsqueeze(-1) * mask.to(log_ratio.dtype)
    raise ValueError(f"unknown policy loss type {loss_type!r}")


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: PolicyLossType = "ppo",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: LossAggregation = "token_mean",
    max_len: int | None = None,
    is_weights: torch.Tensor | None = None,
    units: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with separate low/high epsilon (DAPO's clip-higher) and optional dual clip, on
    the token ratios (`loss_type` ppo) or GSPO's sequence ratios (`policy_ratio`; OpenRLHF aggregates GSPO
    per sequence: pass `seq_mean_token_mean`).

    The log-ratio is clamped to [-20, 20] before `exp`, as OpenRLHF's: an unbounded ratio overflows
    to inf from about 88 on, and inf x 0 on a masked position would make the loss NaN.
    `is_weights` (optional) multiplies the per-token loss: the importance weights of the trainer's old
    log-probs against the rollout engine's (`rollout_is_weights`). `units`: see `aggregate`.
    Returns (loss, clip fraction).
    """
    ratio = policy_ratio(log_probs, old_log_probs, mask, loss_type)
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
    return aggregate(loss, mask, aggregation, max_len, units), clip_frac


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None = 0.5,
    units: torch.Tensor | None = None,
) -> torch.Tensor:
    """0.5 * token mean of the squared error, pessimistic over the clipped and unclipped value
    (`units`: see `aggregate`)."""
    loss = (values - returns).pow(2)
    if clip_eps is not None:
        clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        loss = torch.max((clipped - returns).pow(2), loss)
    return 0.5 * aggregate(loss, mask, "token_mean", units=units)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the softmax over the vocabulary."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each label under `logits / temperature` (the sampling distribution)."""
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def rollout_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                       mode: ISCorrection, low: float, high: float) -> torch.Tensor:
    """Per-token weights w = pi_old / pi_rollout that correct for the rollout engine sampling from slightly
    different numbers than the trainer computes (OpenRLHF's `--algo.advantage.is_correction_type`), no gradient:

    tis: w clamped to [low, high] (truncated importance sampling).
    icepop: w where low <= w <= high, else 0 (a token far off is dropped, not clipped).
    seq-mask-tis: w (unclamped, as OpenRLHF's code) for the sequences whose geometric-mean ratio over their
    valid tokens lies in [low, high]; 0 on every token of the others.
    """
    log_ratio = (old_log_probs - rollout_log_probs).detach()
    weights = log_ratio.exp()
    if mode == "tis":
        return weights.clamp(low, high)
    if mode == "icepop":
        return weights * ((weights >= low) & (weights <= high))
    if mode == "seq-mask-tis":
        seq = masked_mean(log_ratio, mask, dim=-1).exp()
        return weights * ((seq >= low) & (seq <= high)).unsqueeze(-1)
    raise ValueError(f"unknown importance-sampling correction {mode!r}")


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
