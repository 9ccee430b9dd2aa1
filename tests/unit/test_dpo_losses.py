"""Exact values of the DPO-stage losses on hand-checked log-probs."""

import math

import pytest
import torch

from stages.dpo.losses import (
    chosen_nll,
    dpo_loss,
    kto_loss,
    kto_reference_point,
    sequence_logps,
    token_logps,
)

# pair 0: policy prefers chosen by 2 nats more than the reference does (margin 2); pair 1: margin 0
POLICY_C, POLICY_R = torch.tensor([-1.0, -4.0]), torch.tensor([-3.0, -4.0])
REF_C, REF_R = torch.tensor([-2.0, -5.0]), torch.tensor([-2.0, -5.0])


def test_dpo_sigmoid_loss_and_rewards():
    losses, chosen, rejected = dpo_loss(POLICY_C, POLICY_R, REF_C, REF_R, beta=0.5)
    # -log sigmoid(0.5 * 2) = log(1 + e^-1); -log sigmoid(0) = log 2
    assert losses.tolist() == pytest.approx([math.log1p(math.exp(-1)), math.log(2)], abs=1e-6)
    assert chosen.tolist() == pytest.approx([0.5, 0.5])
    assert rejected.tolist() == pytest.approx([-0.5, 0.5])


def test_cdpo_label_smoothing():
    losses, _, _ = dpo_loss(POLICY_C, POLICY_R, REF_C, REF_R, beta=0.5, label_smoothing=0.1)
    # 0.9 * log(1 + e^-1) + 0.1 * log(1 + e^1) = 0.28193552 + 0.13132617
    assert losses[0].item() == pytest.approx(0.41326169, abs=1e-6)
    assert losses[1].item() == pytest.approx(math.log(2), abs=1e-6)  # symmetric at margin 0


def test_ipo_loss():
    losses, _, _ = dpo_loss(POLICY_C, POLICY_R, REF_C, REF_R, beta=0.5, loss_type="ipo")
    assert losses.tolist() == pytest.approx([(2 - 1) ** 2, (0 - 1) ** 2])


def test_dpo_gradient_pushes_chosen_up():
    pc = POLICY_C.clone().requires_grad_()
    losses, _, _ = dpo_loss(pc, POLICY_R, REF_C, REF_R, beta=0.5)
    losses[0].backward()
    # d/dpc -log sigmoid(beta m) = -beta (1 - sigmoid(beta m)) = -0.5 * (1 - sigmoid(1))
    assert pc.grad.tolist() == pytest.approx([-0.5 * (1 - 1 / (1 + math.exp(-1))), 0.0], abs=1e-6)


def test_unknown_pair_loss():
    with pytest.raises(ValueError, match="unknown pair loss"):
        dpo_loss(POLICY_C, POLICY_R, REF_C, REF_R, beta=0.1, loss_type="hinge")


def test_kto_loss_weights_and_reference_point():
    policy, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    losses, rewards = kto_loss(policy, ref, torch.tensor([1, 0]), torch.tensor(0.2), beta=1.0,
                               desirable_weight=1.0, undesirable_weight=2.0)
    # r = [0.5, -1.0]; desirable: 1 - sigmoid(0.3); undesirable: 2 * (1 - sigmoid(1.2))
    assert losses.tolist() == pytest.approx([1 - 1 / (1 + math.exp(-0.3)), 2 * (1 - 1 / (1 + math.exp(-1.2)))], abs=1e-6)
    assert rewards.tolist() == pytest.approx([0.5, -1.0])


def test_kto_reference_point_clamped_and_detached():
    policy_kl = torch.tensor([-1.0, -3.0], requires_grad=True)
    assert kto_reference_point(policy_kl, torch.tensor([-2.0, -1.0])).item() == 0.0  # mean -0.5 clamps to 0
    z0 = kto_reference_point(policy_kl, torch.tensor([-2.0, -3.0]))
    assert z0.item() == pytest.approx(0.5) and not z0.requires_grad


def test_sequence_logps_sum_and_mean_under_mask():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    assert sequence_logps(logps, mask).tolist() == [-5.0, -1.0]
    assert sequence_logps(logps, mask, average=True).tolist() == [-2.5, -0.5]


def test_token_logps_gathers_the_labels():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3), 0.0, 0.0, 0.0]]])
    out = token_logps(logits, torch.tensor([[2, 0]]))
    assert out.tolist()[0] == pytest.approx([math.log(1 / 4), math.log(3 / 6)], abs=1e-6)


def test_chosen_nll_is_the_mean_of_each_responses_token_mean():
    # a 1-token response at -4 and a 3-token one summing to -3: (4 + 1) / 2, not the pooled 7 / 4
    sums = torch.tensor([-4.0, -3.0], requires_grad=True)
    nll = chosen_nll(sums, torch.tensor([1, 3]))
    nll.backward()
    assert nll.item() == pytest.approx(2.5)
    assert sums.grad.tolist() == pytest.approx([-1 / 2, -1 / 6])
    assert chosen_nll(torch.tensor([0.0]), torch.tensor([0])).item() == 0.0  # an empty response: 0, not NaN
