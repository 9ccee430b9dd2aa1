"""Pure loss functions of the DPO stage (OpenRLHF's and TRL's math) on per-sequence log-probs.

A sequence log-prob is the sum of the response tokens' log-probs under a model (the mean for IPO,
as in the IPO paper and TRL). Implicit rewards are `beta * (log pi - log pi_ref)`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels[b, t] | prefix) from `logits[b, t]` (already aligned: position t predicts labels t)."""
    return torch.gather(logits.float().log_softmax(-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def sequence_logps(logps: torch.Tensor, mask: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Per-row sum (or mean) of token log-probs where `mask` is 1."""
    mask = mask.to(logps.dtype)
    total = (logps * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1) if average else total


def chosen_nll(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The chosen responses' NLL: each response's mean over its tokens, then the mean over responses
    (OpenRLHF's `nll_loss_coef` term), from per-response log-prob sums and token counts."""
    return -(sums / counts.clamp(min=1)).mean()


def sigmoid_loss(margin: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """DPO: -log sigmoid(beta * h) with h the log-ratio margin; with `label_smoothing` eps the labels are
    flipped with probability eps: -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h) (conservative DPO)."""
    return -(1 - label_smoothing) * F.logsigmoid(beta * margin) - label_smoothing * F.logsigmoid(-beta * margin)


def ipo_loss(margin: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """IPO: (h - 1 / (2 beta))^2."""
    return (margin - 1 / (2 * beta)) ** 2


# (margin, beta, label_smoothing) -> per-pair losses, by the name a DPO objective gives as its `pair_loss`
PAIR_LOSSES: dict[str, Callable[[torch.Tensor, float, float], torch.Tensor]] = {"sigmoid": sigmoid_loss, "ipo": ipo_loss}


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair losses (`PAIR_LOSSES[loss_type]` of the log-ratio margin) and the chosen / rejected
    implicit rewards (detached)."""
    if loss_type not in PAIR_LOSSES:
        raise ValueError(f"unknown pair loss {loss_type!r} (expected one of: {', '.join(PAIR_LOSSES)})")
    margin = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    losses = PAIR_LOSSES[loss_type](margin, beta, label_smoothing)
    chosen_rewards = beta * (policy_chosen - ref_chosen).detach()
    rejected_rewards = beta * (policy_rejected - ref_rejected).detach()
    return losses, chosen_rewards, rejected_rewards


def kto_reference_point(
    policy_kl: torch.Tensor, ref_kl: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """KTO's z0: the batch estimate of KL(policy || reference) from mismatched prompt/completion pairs
    (averaged over data-parallel ranks by `reduce`), clamped at 0 and detached: no gradient flows
    through the reference point."""
    kl = (policy_kl - ref_kl).mean().detach()
    if reduce is not None:
        kl = reduce(kl)
    return kl.clamp(min=0)


def kto_loss(
    policy: torch.Tensor,
    ref: torch.Tensor,
    desirable: torch.Tensor,
    reference_point: torch.Tensor,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example KTO losses and implicit rewards (detached).

    With r = log pi - log pi_ref: a desirable example costs w_d (1 - sigmoid(beta (r - z0))), an
    undesirable one w_u (1 - sigmoid(beta (z0 - r))).
    """
    logratio = policy - ref
    desirable = desirable.bool()
    losses = torch.where(
        desirable,
        desirable_weight * (1 - torch.sigmoid(beta * (logratio - reference_point))),
        undesirable_weight * (1 - torch.sigmoid(beta * (reference_point - logratio))),
    )
    return losses, beta * logratio.detach()
