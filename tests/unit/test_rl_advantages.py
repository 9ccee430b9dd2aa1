"""Exact values of the advantage estimators and reward shaping on small hand-checked tensors."""

import math

import pytest
import torch

from configs.estimators import ESTIMATORS
from stages.data.tokenization import last_token_index
from stages.rl.advantages import (
    compute_advantages,
    cumulative_returns,
    gae,
    group_mean_baseline,
    group_normalized,
    groups_in_range,
    overlong_penalty,
    rloo_baseline,
    stop_properly_penalty,
    token_rewards,
    varied_groups,
    whiten,
)

SCORES = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0])  # two prompts, three samples each


def test_rloo_subtracts_mean_of_the_others():
    assert rloo_baseline(SCORES, 3).tolist() == pytest.approx([1.0, -0.5, -0.5, -0.5, -0.5, 1.0])


def test_group_mean_baseline():
    assert group_mean_baseline(SCORES, 3).tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -1 / 3, -1 / 3, 2 / 3])


def test_group_norm_uses_unbiased_std_and_zero_for_equal_groups():
    std = math.sqrt(1 / 3)  # sqrt(((2/3)^2 + 2 * (1/3)^2) / 2)
    out = group_normalized(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), 3)
    assert out.tolist() == pytest.approx([2 / 3 / std, -1 / 3 / std, -1 / 3 / std, 0.0, 0.0, 0.0], abs=1e-6)


def test_groups_must_divide_the_batch():
    with pytest.raises(ValueError, match="groups of 4"):
        group_mean_baseline(SCORES, 4)


# Every registered estimator's advantages on one batch: two prompts of three one-token responses scoring
# [3, 0, 0] and [1, 1, 4] (group means 1 and 2); gae's critic values [0, 0, 0, 0, 0, 3]. gamma = lambda = 1.
VECTOR_SCORES, VECTOR_VALUES = torch.tensor([3.0, 0.0, 0.0, 1.0, 1.0, 4.0]), torch.tensor([[0.0]] * 5 + [[3.0]])
S2, S3 = math.sqrt(2), math.sqrt(3)
VECTORS = {
    "gae": [2.0, -1.0, -1.0, 0.0, 0.0, 0.0],  # scores - values = [3, 0, 0, 1, 1, 1], whitened (mean 1, std 1)
    "reinforce": [1.0, -1.0, -1.0, -1 / 3, -1 / 3, 5 / 3],  # the scores whitened (mean 1.5, std 1.5)
    "reinforce_baseline": [2 / S2, -1 / S2, -1 / S2, -1 / S2, -1 / S2, 2 / S2],  # minus the group mean, whitened
    "rloo": [3.0, -1.5, -1.5, -1.5, -1.5, 3.0],  # minus the mean of the other two
    "group_norm": [2 / S3, -1 / S3, -1 / S3, -1 / S3, -1 / S3, 2 / S3],  # (x - mean) / unbiased std (sqrt 3)
    "dr_grpo": [2.0, -1.0, -1.0, -1.0, -1.0, 2.0],  # minus the group mean
}


@pytest.mark.parametrize("name", ESTIMATORS)
def test_every_registered_estimator_gives_its_test_vector(name):
    assert name in VECTORS, f"estimator {name} has no test vector: add its hand-checked advantages to VECTORS"
    values = VECTOR_VALUES if ESTIMATORS[name].needs_critic else None
    adv, _ = compute_advantages(name, VECTOR_SCORES, torch.ones(6, 1), 3, values=values)
    assert adv.flatten().tolist() == pytest.approx(VECTORS[name], abs=1e-5)


def test_overlong_penalty_is_linear_in_the_buffer():
    lengths = torch.tensor([5, 6, 8, 10])
    assert overlong_penalty(lengths, max_len=10, buffer_len=4, factor=1.0).tolist() == pytest.approx([0, 0, -0.5, -1.0])


def test_varied_groups():
    assert varied_groups(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), 3).tolist() == [True, False]


def test_last_token_index():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    assert last_token_index(mask).tolist() == [1, 2, 0]


def test_token_rewards_score_on_last_token_kl_everywhere_dense_added():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.1, 0.1, 0.1]])
    dense = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out = token_rewards(torch.tensor([2.0, 3.0]), mask, kl, kl_coef=0.5, dense=dense)
    assert out.tolist()[0] == pytest.approx([0.45, 1.9, 0.0])
    assert out.tolist()[1] == pytest.approx([-0.05, -0.05, 2.95])


def test_cumulative_returns_discount_and_mask():
    rewards, mask = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1, 1, 0]])
    assert cumulative_returns(rewards, mask, gamma=0.5).tolist()[0] == pytest.approx([2.0, 2.0, 0.0])
    assert cumulative_returns(rewards, mask, gamma=1.0).tolist()[0] == pytest.approx([3.0, 2.0, 0.0])


def test_gae_by_hand():
    # t1: delta = 1 - 0.2 = 0.8; t0: delta = 0 + 0.2 - 0.5 = -0.3, A = -0.3 + 0.5 * 0.8 = 0.1
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.2]]), torch.ones(1, 2), gamma=1.0, lam=0.5)
    assert adv.tolist()[0] == pytest.approx([0.1, 0.8])
    assert ret.tolist()[0] == pytest.approx([0.6, 1.0])


def test_gae_masks_values_beyond_the_response():
    adv, ret = gae(torch.tensor([[0.0, 7.0]]), torch.tensor([[0.5, 9.0]]), torch.tensor([[1, 0]]), gamma=1.0, lam=0.5)
    assert adv.tolist()[0] == pytest.approx([-0.5, 0.0])
    assert ret.tolist()[0] == pytest.approx([0.0, 0.0])


def test_whiten_over_valid_tokens():
    adv, mask = torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1, 1, 0]])
    assert whiten(adv, mask).tolist()[0] == pytest.approx([-1.0, 1.0, 0.0])
    assert whiten(adv, mask, std_norm=False).tolist()[0] == pytest.approx([-1.0, 1.0, 0.0])
    assert whiten(adv * 2, mask, std_norm=False).tolist()[0] == pytest.approx([-2.0, 2.0, 0.0])


def test_grpo_advantages_are_group_normalised_returns_without_whitening():
    s = 1 / math.sqrt(2)
    adv, ret = compute_advantages("group_norm", torch.tensor([1.0, 0.0]), torch.tensor([[1, 1], [1, 0]]), 2)
    assert adv.flatten().tolist() == pytest.approx([s, s, -s, 0.0], abs=1e-6)
    assert torch.equal(ret, adv)


def test_dr_grpo_drops_the_std_division():
    adv, _ = compute_advantages("dr_grpo", torch.tensor([1.0, 0.0]), torch.ones(2, 1), 2)
    assert adv.flatten().tolist() == pytest.approx([0.5, -0.5])


def test_reinforce_with_kl_penalty_then_whitened():
    # rewards [-0.2, 1 - 0.4] -> returns [0.4, 0.6] -> whitened [-1, 1]
    adv, ret = compute_advantages("reinforce", torch.tensor([1.0]), torch.ones(1, 2), 1,
                                  kl=torch.tensor([[0.2, 0.4]]), kl_coef=1.0)
    assert ret.tolist()[0] == pytest.approx([0.4, 0.6])
    assert adv.tolist()[0] == pytest.approx([-1.0, 1.0], abs=1e-4)


def test_gae_estimator_needs_values():
    with pytest.raises(ValueError, match="critic"):
        compute_advantages("gae", torch.tensor([1.0]), torch.ones(1, 2), 1)


def test_reward_clip_applies_after_the_group_baseline():
    # rloo of [30, 0, 0]: [30, -15, -15], then clipped to +-10 (clipping the raw scores first would give [10, -5, -5])
    adv, _ = compute_advantages("rloo", torch.tensor([30.0, 0.0, 0.0]), torch.ones(3, 1), 3, reward_clip=10.0)
    assert adv.flatten().tolist() == pytest.approx([10.0, -10.0, -10.0])
    adv, _ = compute_advantages("dr_grpo", torch.tensor([-40.0, 0.0]), torch.ones(2, 1), 2, reward_clip=10.0)
    assert adv.flatten().tolist() == pytest.approx([-10.0, 10.0])


def test_reward_clip_without_a_group_clips_the_score():
    _, ret = compute_advantages("reinforce", torch.tensor([30.0]), torch.ones(1, 2), 1, reward_clip=10.0)
    assert ret.tolist()[0] == pytest.approx([10.0, 10.0])


@pytest.mark.parametrize("estimator", [n for n, e in ESTIMATORS.items() if e.grouped])
def test_group_estimators_take_no_discount(estimator):
    with pytest.raises(ValueError, match="gamma must be 1"):
        compute_advantages(estimator, torch.tensor([1.0, 0.0]), torch.ones(2, 2), 2, gamma=0.9)


def test_groups_in_range_keep_a_mean_strictly_inside():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.2, 0.2, 0.2])  # means 1/3, 1, 0, 0.2
    assert groups_in_range(scores, 3, 0.0, 1.0).tolist() == [True, False, False, True]
    assert groups_in_range(scores, 3, 0.25, 1.0).tolist() == [True, False, False, False]
    # a group of one sample: its own score is its mean
    assert groups_in_range(torch.tensor([0.5, 1.0]), 1, 0.0, 1.0).tolist() == [True, False]
    assert groups_in_range(torch.ones(4), 2, 0.0, 1.0).tolist() == [False, False]  # every group filtered


@pytest.mark.parametrize(("coef", "expected"), [
    (0.5, [1.0, 0.5, -0.25, 0.0]),  # a truncated reward scaled, the others kept
    (0.0, [1.0, 0.0, 0.0, 0.0]),
    (-0.5, [1.0, -0.5, -0.5, 0.0]),  # below 0: the truncated ones' reward is the coefficient itself
])
def test_stop_properly_penalty_by_hand(coef, expected):
    scores = torch.tensor([1.0, 1.0, -0.5, 0.0])
    truncated = torch.tensor([False, True, True, False])
    assert stop_properly_penalty(scores, truncated, coef).tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\] or negative, got 1\.5"):
        stop_properly_penalty(scores, truncated, 1.5)
