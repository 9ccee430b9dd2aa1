"""Rewards scored in shares (by several reward workers, or in several requests) come back as one batch."""

import pytest
import torch

from stages.rewards.base import RewardBatch, concat


def test_shares_concatenate_in_order_and_their_logs_average_by_size():
    a = RewardBatch(rewards=torch.tensor([1.0, 2.0]), extra_logs={"rm_mean": 1.0, "only_a": 5.0})
    b = RewardBatch(rewards=torch.tensor([3.0]), extra_logs={"rm_mean": 4.0})
    merged = concat([a, b])
    assert merged.rewards.tolist() == [1.0, 2.0, 3.0]
    assert merged.extra_logs == {"rm_mean": pytest.approx(2.0), "only_a": 5.0}  # (1*2 + 4*1) / 3
    assert merged.step_rewards is None


def test_step_rewards_concatenate_too():
    a = RewardBatch(rewards=torch.tensor([1.0]), step_rewards=[[0.5, 0.5]])
    b = RewardBatch(rewards=torch.tensor([0.0]), step_rewards=[[0.1]])
    assert concat([a, b]).step_rewards == [[0.5, 0.5], [0.1]]
