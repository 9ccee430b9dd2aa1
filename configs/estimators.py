"""The advantage estimators (`rl.algorithm.advantage_estimator`), declared once: what each needs and how the RL
stage treats it. The schema validates against this registry; `stages/rl/advantages.py` computes with
it (its `SHAPINGS` hold the tensor math each entry names).

An estimator shapes a rollout's sequence scores (`shaping`, e.g. a group's baseline subtracted), then
spreads them over the tokens and accumulates them: with a critic, GAE; without, discounted returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from configs.registry import Registry

LossAggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


@dataclass(frozen=True)
class Estimator:
    name: str
    shaping: str  # a key of stages.rl.advantages.SHAPINGS: (scores [B], n) -> shaped scores [B]
    about: str = ""  # what it is, for the config reference
    needs_critic: bool = False  # learns a value function (GAE): the stage trains a critic
    grouped: bool = False  # compares the n samples of a prompt: needs n_samples_per_prompt > 1 and gamma 1
    whiten: bool = False  # batch-wide advantage normalisation after the returns are computed (as OpenRLHF)
    aggregation: LossAggregation = "token_mean"  # the policy loss's default `rl.algorithm.loss_aggregation`


ESTIMATORS = Registry("advantage estimator", (
    Estimator("gae", "none", "PPO with a critic", needs_critic=True, whiten=True),
    Estimator("reinforce", "none", "REINFORCE++", whiten=True),
    Estimator("reinforce_baseline", "group_mean", grouped=True, whiten=True),
    Estimator("rloo", "leave_one_out", grouped=True),
    Estimator("group_norm", "group_norm", "GRPO", grouped=True),
    Estimator("dr_grpo", "group_mean", "Dr. GRPO", grouped=True, aggregation="seq_mean_token_sum_norm"),
))
