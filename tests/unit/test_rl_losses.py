"""Exact values of the RL losses on small hand-checked tensors."""

import math

import pytest
import torch

from stages.rl.losses import (
    AdaptiveKLController,
    FixedKLController,
    aggregate,
    approx_kl,
    entropy_from_logits,
    log_probs_from_logits,
    masked_mean,
    policy_loss,
    truncated_is_weights,
    value_loss,
)

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_masked_mean_over_all_and_per_row():
    assert masked_mean(VALUES, MASK).item() == pytest.approx(7 / 3)
    assert masked_mean(VALUES, MASK, dim=-1).tolist() == pytest.approx([1.5, 4.0])


def test_masked_mean_of_empty_mask_is_zero_not_nan():
    assert masked_mean(VALUES, torch.zeros_like(MASK)).item() == 0.0


@pytest.mark.parametrize(
    "mode, expected",
    [("token_mean", 7 / 3), ("seq_mean_token_mean", (1.5 + 4.0) / 2), ("seq_mean_token_sum_norm", (3 / 4 + 4 / 4) / 2)],
)
def test_aggregation_modes(mode, expected):
    assert aggregate(VALUES, MASK, mode, max_len=4).item() == pytest.approx(expected)


def test_sum_norm_needs_max_len():
    with pytest.raises(ValueError, match="max_len"):
        aggregate(VALUES, MASK, "seq_mean_token_sum_norm")


@pytest.mark.parametrize(
    "estimator, expected",
    [("k1", [1.0, -1.0]), ("k2", [0.5, 0.5]), ("k3", [math.exp(-1), math.e - 2])],
)
def test_kl_estimators(estimator, expected):
    log_probs, ref = torch.tensor([0.0, -1.0]), torch.tensor([-1.0, 0.0])
    assert approx_kl(log_probs, ref, estimator).tolist() == pytest.approx(expected, abs=1e-6)


def test_k3_is_zero_at_equal_policies_and_finite_far_away():
    assert approx_kl(torch.tensor([-2.0]), torch.tensor([-2.0]), "k3").item() == 0.0
    assert torch.isfinite(approx_kl(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")).all()


# ratios 1.5, 0.5, 1.0 against old log-probs of 0; advantages 1, -1, 2
LOG_PROBS = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
OLD = torch.zeros(1, 3)
ADV = torch.tensor([[1.0, -1.0, 2.0]])
ONES = torch.ones(1, 3)


def test_ppo_clip_symmetric():
    # token 0: min(1.5, 1.2) = 1.2 (clipped); token 1: min(-0.5, -0.8) = -0.8 (clipped); token 2: 2
    loss, clip_frac = policy_loss(LOG_PROBS, OLD, ADV, ONES)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.0) / 3)
    assert clip_frac.item() == pytest.approx(2 / 3)


def test_ppo_clip_higher_lets_positive_advantages_grow():
    loss, clip_frac = policy_loss(LOG_PROBS, OLD, ADV, ONES, clip_eps_low=0.2, clip_eps_high=0.6)
    assert loss.item() == pytest.approx((-1.5 + 0.8 - 2.0) / 3)
    assert clip_frac.item() == pytest.approx(1 / 3)


def test_ppo_loss_ignores_masked_tokens():
    loss, _ = policy_loss(LOG_PROBS, OLD, ADV, torch.tensor([[1, 1, 0]]))
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)


def test_dual_clip_bounds_negative_advantage_loss():
    log_probs, adv = torch.log(torch.tensor([[4.0]])), torch.tensor([[-1.0]])
    plain, _ = policy_loss(log_probs, torch.zeros(1, 1), adv, torch.ones(1, 1))
    dual, _ = policy_loss(log_probs, torch.zeros(1, 1), adv, torch.ones(1, 1), dual_clip=3.0)
    assert plain.item() == pytest.approx(4.0)  # -min(4 * -1, 1.2 * -1)
    assert dual.item() == pytest.approx(3.0)  # bounded by -dual_clip * A
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(log_probs, torch.zeros(1, 1), adv, torch.ones(1, 1), dual_clip=1.0)


def test_importance_weights_scale_the_token_loss():
    loss, _ = policy_loss(LOG_PROBS, OLD, ADV, ONES, is_weights=torch.tensor([[0.5, 1.0, 1.0]]))
    assert loss.item() == pytest.approx((-0.6 + 0.8 - 2.0) / 3)


def test_truncated_is_weights():
    old = torch.zeros(2)
    rollout = torch.log(torch.tensor([0.25, 2.0]))  # ratios 4 and 0.5
    assert truncated_is_weights(old, rollout, cap=2.0).tolist() == pytest.approx([2.0, 0.5])


def test_policy_loss_seq_mean_aggregation():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    log_probs = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 3.0, 9.0], [4.0, 9.0, 9.0]])
    loss, _ = policy_loss(log_probs, log_probs, adv, mask, aggregation="seq_mean_token_mean")
    assert loss.item() == pytest.approx(-(2.0 + 4.0) / 2)


def test_value_loss_clipped_and_unclipped():
    values, old, returns, mask = torch.tensor([[0.5, -0.1]]), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)
    # token 0: clipped value 0.2 -> max((0.2-1)^2, (0.5-1)^2) = 0.64; token 1: 1.21 either way
    assert value_loss(values, old, returns, mask, clip_eps=0.2).item() == pytest.approx(0.5 * (0.64 + 1.21) / 2)
    assert value_loss(values, old, returns, mask, clip_eps=None).item() == pytest.approx(0.5 * (0.25 + 1.21) / 2)


def test_entropy_of_uniform_distribution():
    assert entropy_from_logits(torch.zeros(1, 4)).item() == pytest.approx(math.log(4))
    assert entropy_from_logits(torch.tensor([[0.0, -1e4]])).item() == pytest.approx(0.0, abs=1e-6)


def test_log_probs_with_temperature():
    logits = torch.tensor([[[0.0, math.log(3)]]])
    labels = torch.tensor([[1]])
    assert log_probs_from_logits(logits, labels).item() == pytest.approx(math.log(0.75))
    p = math.sqrt(3) / (1 + math.sqrt(3))  # softmax of [0, ln(3)/2]
    assert log_probs_from_logits(logits, labels, temperature=2.0).item() == pytest.approx(math.log(p))


def test_adaptive_kl_controller_moves_toward_target():
    up = AdaptiveKLController(0.1, target=1.0, horizon=10)
    assert up.update(current_kl=2.0, n_steps=5) == pytest.approx(0.1 * 1.1)  # error clipped to +0.2
    down = AdaptiveKLController(0.1, target=1.0, horizon=10)
    assert down.update(current_kl=0.5, n_steps=1) == pytest.approx(0.1 * 0.98)  # error clipped to -0.2
    assert FixedKLController(0.3).update(5.0, 10) == 0.3
