"""The one interface every reward source implements, and the checks on what a source returns.

A source scores (prompt, response) pairs: `prompts` are the rendered prompt texts the policy saw,
`responses` the generated texts, `labels` the reference answers (None where a prompt has none).
A "query" is `prompt + response`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from configs.errors import RewardError, first_line

MAX_EXTRA_LOGS = 32  # extra_logs keys a source may give (a reward file's or a reward server's)
LOG_KEY = re.compile(r"[A-Za-z0-9_./-]{1,64}")  # a key as it becomes part of an MLflow metric name


@dataclass
class RewardBatch:
    rewards: torch.Tensor  # [B] float32, one scalar per response
    step_rewards: list[list[float]] | None = None  # per-step scores (process reward sources only)
    extra_logs: dict[str, float] = field(default_factory=dict)  # batch means, for the metrics log
    # what dynamic filtering reads, where the source gives it apart from the rewards (OpenRLHF's `scores`, e.g. a
    # 0/1 correctness beside a shaped reward); None: the rewards
    scores: torch.Tensor | None = None

    def filter_values(self) -> torch.Tensor:
        """The values dynamic filtering compares within a group: the scores where given, else the rewards."""
        return self.rewards if self.scores is None else self.scores


@runtime_checkable
class RewardSource(Protocol):
    def score(self, prompts: list[str], responses: list[str], labels: list[str | None]) -> RewardBatch: ...


def concat(parts: list[RewardBatch]) -> RewardBatch:
    """One batch from consecutive parts; a part's `extra_logs` (batch means) count by its size."""
    steps = None
    if parts[0].step_rewards is not None:
        steps = []
        for p in parts:
            if p.step_rewards is None:
                raise ValueError("concat: parts with and without step_rewards (one source scores every part)")
            steps.extend(p.step_rewards)
    logs = {}
    for key in dict.fromkeys(k for p in parts for k in p.extra_logs):
        having = [(p.extra_logs[key], len(p.rewards)) for p in parts if key in p.extra_logs]
        logs[key] = sum(v * n for v, n in having) / sum(n for _, n in having)
    scores = None
    if any(p.scores is not None for p in parts):
        scores = torch.cat([p.filter_values() for p in parts])  # a part without scores is filtered on its rewards
    return RewardBatch(rewards=torch.cat([p.rewards for p in parts]), step_rewards=steps, extra_logs=logs, scores=scores)


def check_batch(prompts: list[str], responses: list[str], labels: list[str | None]) -> None:
    """The three inputs line up; a mismatch is a caller bug, so a plain ValueError."""
    if not len(prompts) == len(responses) == len(labels):
        raise ValueError(f"{len(prompts)} prompts, {len(responses)} responses, {len(labels)} labels")


def as_rewards(values: Any, n: int, source: str) -> torch.Tensor:
    """`values` as a finite float32 tensor of shape [n]; anything else is a RewardError naming `source`."""
    try:
        rewards = torch.as_tensor(values.detach().cpu() if isinstance(values, torch.Tensor) else values,
                                  dtype=torch.float32).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise RewardError(f"{source}: rewards are not numbers (got {_describe(values)}: {first_line(exc)})") from None
    if rewards.numel() != n:
        raise RewardError(f"{source}: returned {rewards.numel()} rewards for {n} queries (got {_describe(values)}; "
                          "expected one number per query)")
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    if bad:
        raise RewardError(f"{source}: returned non-finite rewards (NaN/inf) at indices {bad[:10]}")
    return rewards


def mean_logs(logs: Any, source: str) -> dict[str, float]:
    """Each extra log (a tensor, list or number) averaged to one float."""
    if logs is None:
        return {}
    if not isinstance(logs, Mapping):
        raise RewardError(f"{source}: extra_logs must be a dict of numbers or tensors, got {_describe(logs)}")
    if len(logs) > MAX_EXTRA_LOGS:  # each key becomes an MLflow metric of the run: a bounded set
        raise RewardError(f"{source}: extra_logs has {len(logs)} keys, over {MAX_EXTRA_LOGS}; log fewer")
    out = {}
    for key, value in logs.items():
        if not isinstance(key, str) or not LOG_KEY.fullmatch(key):
            raise RewardError(f"{source}: extra_logs key {_describe(key)} is not a metric name (up to 64 letters, "
                              "digits and _ - . /); rename it")
        try:
            values = torch.as_tensor(value.detach().cpu() if isinstance(value, torch.Tensor) else value,
                                     dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError):
            raise RewardError(f"{source}: extra_logs[{key!r}] is not numeric (got {_describe(value)})") from None
        if values.numel():  # an empty tensor has no mean worth logging
            out[str(key)] = float(values.mean())
    return out


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
