"""The held-out metrics of a policy, as the eval stage and the RL stage's periodic evals report them:
one pure function from the scored responses to the metrics dict."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def held_out_metrics(rewards: Sequence[float] | torch.Tensor, sampled: Sequence[Sequence[float]] | torch.Tensor | None,
                     lengths: Sequence[int] | torch.Tensor, correct: Sequence[bool] | None = None,
                     sampled_correct: Sequence[Sequence[bool]] | torch.Tensor | None = None) -> dict[str, float]:
    """Metrics over n held-out prompts.

    rewards [n]: the greedy response's reward per prompt; sampled [n, k]: the rewards of k responses
    drawn per prompt (None or k = 0: greedy only); lengths [n]: the greedy responses' token counts;
    correct [n] / sampled_correct [n, k]: whether each response's regex answer matches the label (None
    without `eval.answer_pattern`).

    Returns `reward` (mean greedy reward), `sampled_reward` (mean over the n x k samples), `pass_at_k`
    (where every sampled reward is 0 or 1: the share of prompts with at least one sample of reward 1,
    i.e. the unbiased pass@k estimator 1 - C(m - c, k) / C(m, k) of m samples with c correct, at m = k),
    `accuracy` / `sampled_accuracy` (the share of correct greedy / sampled responses) and
    `response_length` (mean greedy tokens), each only where its inputs are given.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    n = rewards.numel()
    if n == 0:
        raise ValueError("no held-out prompts to score")
    metrics = {"reward": float(rewards.mean())}
    drawn = None if sampled is None else torch.as_tensor(sampled, dtype=torch.float64)
    if drawn is not None and (drawn.dim() != 2 or drawn.shape[0] != n):
        raise ValueError(f"sampled rewards of shape {tuple(drawn.shape)}, expected [{n}, k]")
    k = 0 if drawn is None else drawn.shape[1]
    if drawn is not None and k:
        metrics["sampled_reward"] = float(drawn.mean())
        if bool((drawn.eq(0) | drawn.eq(1)).all()):
            metrics["pass_at_k"] = float(drawn.eq(1).any(dim=1).double().mean())
    if correct is not None:
        metrics["accuracy"] = float(torch.as_tensor(correct, dtype=torch.float64).mean())
        if k and sampled_correct is not None:
            metrics["sampled_accuracy"] = float(torch.as_tensor(sampled_correct, dtype=torch.float64).mean())
    metrics["response_length"] = float(torch.as_tensor(lengths, dtype=torch.float64).mean())
    return metrics


def by_prompt(values: list, n: int) -> list[list]:
    """Values for n prompts, k consecutive ones each (as the prompts were repeated to sample), as [n][k]."""
    k = len(values) // n if n else 0
    return [values[i * k : (i + 1) * k] for i in range(n)]
