"""Exact values of the RL losses on small hand-checked tensors."""

import functools
import math
import operator

import pytest
import torch

from stages.rl.losses import (
    AdaptiveKLController,
    FixedKLController,
    aggregate,
    approx_kl,
    entropy_from_logits,
    log_probs_from_logits,
    loss_units,
    masked_mean,
    policy_loss,
    policy_ratio,
    rollout_is_weights,
    step_units,
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
    ("mode", "expected"),
    [("token_mean", 7 / 3), ("seq_mean_token_mean", (1.5 + 4.0) / 2), ("seq_mean_token_sum_norm", (3 / 4 + 4 / 4) / 2)],
)
def test_aggregation_modes(mode, expected):
    assert aggregate(VALUES, MASK, mode, max_len=4).item() == pytest.approx(expected)


def test_sum_norm_needs_max_len():
    with pytest.raises(ValueError, match="max_len"):
        aggregate(VALUES, MASK, "seq_mean_token_sum_norm")


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [("k1", [1.0, -1.0]), ("k2", [0.5, 0.5]), ("k3", [math.exp(-1), math.e - 2])],
)
def test_kl_estimators(estimator, expected):
    log_probs, ref = torch.tensor([0.0, -1.0]), torch.tensor([-1.0, 0.0])
    assert approx_kl(log_probs, ref, estimator).tolist() == pytest.approx(expected, abs=1e-6)


def test_k3_is_zero_at_equal_policies():
    assert approx_kl(torch.tensor([-2.0]), torch.tensor([-2.0]), "k3").item() == 0.0


# log-ratios from moderate to far beyond every bound (float32 exp overflows from about 88 on)
EXTREME = [0.5, -0.5, 2.0, -2.0, 5.0, -5.0, 30.0, -30.0, 100.0, -100.0]


def bounded_kl(r: float, estimator: str) -> tuple[float, float]:
    """OpenRLHF's estimate clamped to [-10, 10], and its derivative in the log-ratio r (0 where clamped)."""
    if estimator == "k1":
        value, slope = r, 1.0
    elif estimator == "k2":
        value, slope = r * r / 2, r
    else:
        value, slope = math.exp(-r) - 1 + r, 1 - math.exp(-r)
    return (max(-10.0, min(10.0, value)), slope if -10 < value < 10 else 0.0)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_equal_the_bounded_formula_and_its_gradient_at_extreme_log_ratios(estimator):
    log_probs = torch.tensor(EXTREME, requires_grad=True)
    ref = torch.zeros(len(EXTREME), requires_grad=True)
    kl = approx_kl(log_probs, ref, estimator)
    kl.sum().backward()
    expected = [bounded_kl(r, estimator) for r in EXTREME]
    torch.testing.assert_close(kl, torch.tensor([v for v, _ in expected]))
    torch.testing.assert_close(log_probs.grad, torch.tensor([g for _, g in expected]))
    torch.testing.assert_close(ref.grad, -log_probs.grad)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_loss_on_masked_extreme_tokens_is_finite_and_ignores_them(estimator):
    # token 0 counts (log-ratio 0.5); the others are padding with log-ratios of +-100 and +-30
    log_probs = torch.tensor([[0.5, 100.0, -100.0, 30.0, -30.0]], requires_grad=True)
    mask = torch.tensor([[1, 0, 0, 0, 0]])
    loss = aggregate(approx_kl(log_probs, torch.zeros(1, 5), estimator), mask, "token_mean")
    loss.backward()
    value, slope = bounded_kl(0.5, estimator)
    torch.testing.assert_close(loss, torch.tensor(value))
    torch.testing.assert_close(log_probs.grad, torch.tensor([[slope, 0.0, 0.0, 0.0, 0.0]]))


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


def bounded_ppo(r: float, a: float, eps: float = 0.2, dual_clip: float | None = None) -> tuple[float, float]:
    """OpenRLHF's PPO token loss with the log-ratio r clamped to [-20, 20] before exp, and its derivative
    in the log-prob (0 where r or the ratio is clipped, or where the dual clip bounds the loss)."""
    ratio = math.exp(max(-20.0, min(20.0, r)))
    unclipped, clipped = ratio * a, max(1 - eps, min(1 + eps, ratio)) * a
    objective = min(unclipped, clipped)
    in_range = -20 < r < 20 and (unclipped <= clipped or 1 - eps < ratio < 1 + eps)
    slope = a * ratio if in_range else 0.0
    if dual_clip is not None and a < 0 and dual_clip * a > objective:
        objective, slope = dual_clip * a, 0.0
    return -objective, -slope


def extreme_batch():
    """Every EXTREME log-ratio with advantage +1 and -1, in two rows; the second row's last five
    tokens are padding with log-ratios of +-100 and +-30 and large advantages."""
    ratios = EXTREME + EXTREME
    advantages = [1.0] * len(EXTREME) + [-1.0] * len(EXTREME)
    pad_r, pad_a = [100.0, -100.0, 30.0, -30.0, 100.0], [-5.0, 5.0, -5.0, 5.0, 5.0]
    log_probs = torch.tensor([ratios, EXTREME + pad_r + pad_r], requires_grad=True)
    adv = torch.tensor([advantages, [1.0] * len(EXTREME) + pad_a + pad_a])
    mask = torch.ones(2, 2 * len(EXTREME))
    mask[1, len(EXTREME):] = 0
    return log_probs, adv, mask


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_policy_loss_equals_the_bounded_formula_and_its_gradient_at_extreme_log_ratios(dual_clip):
    log_probs, adv, mask = extreme_batch()
    loss, _ = policy_loss(log_probs, torch.zeros_like(log_probs), adv, mask, dual_clip=dual_clip)
    loss.backward()
    n = int(mask.sum())
    terms = [[bounded_ppo(r, a, dual_clip=dual_clip) if m else (0.0, 0.0) for r, a, m in zip(*row)]
             for row in zip(log_probs.tolist(), adv.tolist(), mask.tolist())]
    expected_loss = sum(v for row in terms for v, _ in row) / n
    torch.testing.assert_close(loss, torch.tensor(expected_loss))
    torch.testing.assert_close(log_probs.grad, torch.tensor([[g / n for _, g in row] for row in terms]))
    assert log_probs.grad[1, len(EXTREME):].eq(0).all()  # the padding's log-ratios of +-100 add nothing


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_policy_loss_is_finite_when_only_padding_is_extreme(mode):
    log_probs = torch.tensor([[0.1, 100.0, 200.0], [-0.1, -100.0, 95.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0]])
    mask = torch.tensor([[1, 0, 0], [1, 0, 0]])
    loss, _ = policy_loss(log_probs, torch.zeros(2, 3), adv, mask, aggregation=mode, max_len=4)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_probs.grad).all()
    assert log_probs.grad[:, 1:].eq(0).all()


# pi_old / pi_rollout per token: row 0's geometric mean is 1.5^(1/3) = 1.145, row 1's (0.1 x 1)^(1/2) = 0.316
IS_RATIOS = torch.tensor([[4.0, 0.25, 1.5], [0.1, 1.0, 1.0]])
IS_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


@pytest.mark.parametrize(("mode", "expected"), [
    ("tis", [[2.0, 0.5, 1.5], [0.5, 1.0, 1.0]]),  # clamped to [0.5, 2]
    ("icepop", [[0.0, 0.0, 1.5], [0.0, 1.0, 1.0]]),  # outside [0.5, 2]: 0
    ("seq-mask-tis", [[4.0, 0.25, 1.5], [0.0, 0.0, 0.0]]),  # row 1's mean 0.316 < 0.5: the whole row 0
])
def test_rollout_is_weights_by_hand(mode, expected):
    old = torch.zeros(2, 3, requires_grad=True)
    weights = rollout_is_weights(old, -IS_RATIOS.log(), IS_MASK, mode, low=0.5, high=2.0)
    assert weights.flatten().tolist() == pytest.approx(functools.reduce(operator.iadd, expected, []), rel=1e-6)
    assert not weights.requires_grad  # a weight, not a path for the gradient


@pytest.mark.parametrize(("mode", "expected"), [("tis", [[5.0, 0.5]]), ("icepop", [[0.0, 0.0]]), ("seq-mask-tis", [[0.0, 0.0]])])
def test_rollout_is_weights_at_ratios_of_e_to_the_30(mode, expected):
    """e^30 and e^-30 are finite in float32; each mode bounds, drops or masks them (row mean 0: seq-mask keeps
    the row's geometric mean of 1 in range, so here a row of two e^30 tokens is used)."""
    log_ratio = torch.tensor([[30.0, -30.0]]) if mode == "tis" else torch.tensor([[30.0, 30.0]])
    weights = rollout_is_weights(log_ratio, torch.zeros(1, 2), torch.ones(1, 2), mode, low=0.5, high=5.0)
    assert weights.flatten().tolist() == pytest.approx(functools.reduce(operator.iadd, expected, [])) and torch.isfinite(weights).all()


def test_gspo_ratio_is_the_geometric_mean_of_the_token_ratios():
    log_ratio = torch.tensor([[0.05, 0.05, 7.0], [-0.1, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    ratio = policy_ratio(log_ratio, torch.zeros(2, 3), mask, "gspo")
    # padding neither counts nor gets a ratio
    assert ratio.flatten().tolist() == pytest.approx([math.exp(0.05), math.exp(0.05), 0.0, math.exp(-0.1), 0.0, 0.0])
    assert policy_ratio(log_ratio, torch.zeros(2, 3), mask, "ppo")[0].tolist() == pytest.approx(
        [math.exp(0.05), math.exp(0.05), math.exp(7.0)], rel=1e-6)


def test_gspo_loss_and_gradient_by_hand():
    """Row 0: log-ratios 0.05, 0.05 (ratio r0 = e^0.05, inside the clip) and advantage 1; row 1: one token at
    -0.1 (r1 = e^-0.1) and advantage -1. Per sequence: -r0 and r1; their mean is the loss. d/d(log p) of
    row 0's tokens: -r0 x 1/2 (the mean over its 2 tokens) x 1/2 (over 2 sequences); of row 1's: r1 / 2."""
    log_probs = torch.tensor([[0.05, 0.05, 0.0], [-0.1, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, clip_frac = policy_loss(log_probs, torch.zeros(2, 3), adv, mask, loss_type="gspo", aggregation="seq_mean_token_mean")
    r0, r1 = math.exp(0.05), math.exp(-0.1)
    assert loss.item() == pytest.approx((-r0 + r1) / 2, rel=1e-6)
    loss.backward()
    assert log_probs.grad.flatten().tolist() == pytest.approx([-r0 / 4, -r0 / 4, 0.0, r1 / 2, 0.0, 0.0], rel=1e-6)
    assert clip_frac.item() == 0.0


@pytest.mark.parametrize(("log_ratio", "adv", "expected"), [
    (30.0, 1.0, -1.2),  # clipped at 1 + eps
    (30.0, -1.0, math.exp(20)),  # unclipped on the pessimistic side, at the clamp's e^20
    (-30.0, 1.0, -math.exp(-20)),
    (-30.0, -1.0, 0.8),  # clipped at 1 - eps
])
def test_gspo_at_ratios_of_e_to_the_30(log_ratio, adv, expected):
    log_probs = torch.full((1, 2), log_ratio, requires_grad=True)
    loss, _ = policy_loss(log_probs, torch.zeros(1, 2), torch.full((1, 2), adv), torch.ones(1, 2), loss_type="gspo",
                          aggregation="seq_mean_token_mean")
    loss.backward()
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert log_probs.grad.eq(0).all()  # beyond the clamp and the clip, no gradient, and no NaN


def test_policy_loss_seq_mean_aggregation():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    log_probs = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 3.0, 9.0], [4.0, 9.0, 9.0]])
    loss, _ = policy_loss(log_probs, log_probs, adv, mask, aggregation="seq_mean_token_mean")
    assert loss.item() == pytest.approx(-(2.0 + 4.0) / 2)


# two micro-batches of one optimizer step, 5 and 1 valid tokens; sequence lengths 3, 2 and 1
MICRO_MASKS = [torch.tensor([[1, 1, 1], [1, 1, 0]]), torch.tensor([[1, 0, 0], [0, 0, 0]])]
MICRO_ADV = [torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 9.0]]), torch.tensor([[-4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])]
MICRO_LOG_RATIOS = [torch.tensor([[0.1, -0.3, 0.05], [0.02, 0.4, 7.0]]), torch.tensor([[-0.1, 3.0, -3.0], [1.0, 1.0, 1.0]])]


def test_loss_units_and_step_units():
    assert loss_units(MICRO_MASKS[0]).tolist() == [5.0, 2.0]
    assert loss_units(MICRO_MASKS[1]).tolist() == [1.0, 1.0]  # the empty row is no sequence
    assert step_units(MICRO_MASKS).tolist() == [3.0, 1.5]
    # two ranks: the all-reduce sums both ranks' counts (here the other rank saw the same)
    assert step_units(MICRO_MASKS, ranks=2, reduce=lambda t: 2 * t).tolist() == [3.0, 1.5]


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_uneven_micro_batches_accumulate_to_the_mean_over_the_whole_step(mode):
    """Each micro-batch divided by the step's units, then averaged as DeepSpeed averages the gradient
    accumulation steps: the loss and gradient of one batch holding both micro-batches."""
    units = step_units(MICRO_MASKS)
    ratios = [r.clone().requires_grad_() for r in MICRO_LOG_RATIOS]
    parts = [policy_loss(r, torch.zeros(2, 3), a, m, aggregation=mode, max_len=4, units=units)[0]
             for r, a, m in zip(ratios, MICRO_ADV, MICRO_MASKS)]
    accumulated = sum(parts) / len(parts)
    accumulated.backward()

    whole = torch.cat(MICRO_LOG_RATIOS).requires_grad_()
    one, _ = policy_loss(whole, torch.zeros(4, 3), torch.cat(MICRO_ADV), torch.cat(MICRO_MASKS), aggregation=mode, max_len=4)
    one.backward()
    torch.testing.assert_close(accumulated, one)
    torch.testing.assert_close(torch.cat([r.grad for r in ratios]), whole.grad)
    # the mean of the micro-batches' own means is another number
    local = sum(policy_loss(r, torch.zeros(2, 3), a, m, aggregation=mode, max_len=4)[0]
                for r, a, m in zip(MICRO_LOG_RATIOS, MICRO_ADV, MICRO_MASKS)) / 2
    assert abs(local.item() - one.item()) > 0.1


def test_value_loss_over_uneven_micro_batches_is_the_step_token_mean():
    values = [torch.tensor([[0.5, -0.1, 0.3], [1.0, 2.0, 0.0]]), torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])]
    units = step_units(MICRO_MASKS)
    accumulated = sum(value_loss(v, torch.zeros(2, 3), torch.ones(2, 3), m, units=units)
                      for v, m in zip(values, MICRO_MASKS)) / 2
    whole = value_loss(torch.cat(values), torch.zeros(4, 3), torch.ones(4, 3), torch.cat(MICRO_MASKS))
    torch.testing.assert_close(accumulated, whole)


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
