"""Knowledge-distillation losses as pure functions of logits: the divergences between the teacher's and
the student's next-token distributions, averaged over the trained tokens, and their mix with the NLL
(OpenRLHF's `train_kd`: loss = (1 - kd_coef) NLL + kd_coef divergence).

OpenRLHF's distil loss is the cross-entropy -sum_v p_t log p_s; the forward KL here is that minus the
teacher's entropy, which the student cannot change: the same gradient, and 0 when the two agree."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is true (0 where there are none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def kl_per_token(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_v p_v (log p_v - log q_v) over the last dim, from log-probs. A token p gives no
    probability (a -inf logit) contributes 0 (0 log 0 = 0); one q gives none but p does makes it +inf."""
    terms = logp.exp() * (logp - logq)
    return terms.masked_fill(torch.isneginf(logp), 0.0).sum(-1)


def forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per token [..., V] -> a token mean over `mask`: mean-seeking, the student
    covers every token the teacher gives mass (OpenRLHF's `KDLoss`)."""
    teacher = F.log_softmax(teacher_logits.float(), dim=-1)
    return masked_mean(kl_per_token(teacher, F.log_softmax(student_logits.float(), dim=-1)), mask)


def reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(student || teacher) per token -> a token mean over `mask`: mode-seeking, the student keeps to
    the teacher's likely tokens (MiniLLM's objective, here token by token on the training sequences)."""
    student = F.log_softmax(student_logits.float(), dim=-1)
    return masked_mean(kl_per_token(student, F.log_softmax(teacher_logits.float(), dim=-1)), mask)


DIVERGENCES = {"forward": forward_kl, "reverse": reverse_kl}


def token_nll(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of `labels` [B, T] under `logits` [B, T, V] (positions already aligned)."""
    return F.cross_entropy(logits.float().flatten(0, -2), labels.flatten(), ignore_index=ignore_index)


def kd_loss(nll: torch.Tensor, divergence: torch.Tensor, kd_coef: float) -> torch.Tensor:
    """(1 - kd_coef) NLL + kd_coef divergence."""
    return (1.0 - kd_coef) * nll + kd_coef * divergence
