"""stages/eval/metrics.py: the held-out metrics the eval stage and RL's periodic evals report."""

from math import comb
from typing import get_args

import pytest

from configs.schema import EvalMetric
from stages.eval.metrics import by_prompt, held_out_metrics

# 4 prompts, k = 2 samples each
REWARDS = [1.0, 0.0, 1.0, 0.0]
SAMPLED = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]]
LENGTHS = [3, 5, 7, 9]
CORRECT = [True, False, False, False]
SAMPLED_CORRECT = [[True, False], [False, False], [True, True], [False, False]]


def test_every_metric_from_rewards_lengths_and_regex_checks():
    got = held_out_metrics(REWARDS, SAMPLED, LENGTHS, CORRECT, SAMPLED_CORRECT)
    assert got == {"reward": 0.5, "sampled_reward": 0.5, "pass_at_k": 0.75, "accuracy": 0.25,
                   "sampled_accuracy": 0.375, "response_length": 6.0}
    assert set(get_args(EvalMetric)) <= set(got)  # every metric eval.metric may name is one the function reports


def test_pass_at_k_is_the_unbiased_estimator_with_as_many_samples_as_k():
    sampled = [[1, 1, 0], [0, 0, 0], [0, 0, 1], [1, 1, 1], [0, 1, 0]]
    k = 3
    unbiased = [1 - comb(k - sum(row), k) / comb(k, k) for row in sampled]  # 1 - C(m-c, k)/C(m, k) at m = k
    got = held_out_metrics([0.0] * 5, sampled, [1] * 5)["pass_at_k"]
    assert got == sum(unbiased) / 5 == 0.8


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_all_equal_zero_one_rewards(value):
    got = held_out_metrics([value] * 3, [[value] * 4] * 3, [2, 2, 2])
    assert got == {"reward": value, "sampled_reward": value, "pass_at_k": value, "response_length": 2.0}


def test_rewards_that_are_not_zero_one_have_no_pass_at_k():
    got = held_out_metrics([-2.0, 3.0], [[0.5, 1.0], [0.0, 1.0]], [4, 6])
    assert got == {"reward": 0.5, "sampled_reward": 0.625, "response_length": 5.0}
    assert "pass_at_k" not in held_out_metrics([1.0], [[1.0, 2.0]], [1])


@pytest.mark.parametrize("sampled", [None, [[], [], [], []]])
def test_greedy_only_without_samples(sampled):
    """k = 0 (eval.samples_per_prompt: 0): no sampled metric, even with regex checks given."""
    got = held_out_metrics(REWARDS, sampled, LENGTHS, CORRECT, [[], [], [], []])
    assert got == {"reward": 0.5, "accuracy": 0.25, "response_length": 6.0}


def test_sampled_rewards_must_be_one_row_per_prompt():
    with pytest.raises(ValueError, match=r"sampled rewards of shape \(8,\), expected \[4, k\]"):
        held_out_metrics(REWARDS, [r for row in SAMPLED for r in row], LENGTHS)
    with pytest.raises(ValueError, match="no held-out prompts"):
        held_out_metrics([], None, [])


def test_by_prompt_groups_consecutive_samples():
    assert by_prompt([1, 2, 3, 4, 5, 6], 3) == [[1, 2], [3, 4], [5, 6]]
    assert by_prompt([], 2) == [[], []]


def test_rls_before_after_table_shows_a_metric_only_one_side_has():
    from stages.rl.stage import before_after

    table = before_after({"reward": 0.5, "pass_at_k": 1.0}, {"reward": 0.25, "sampled_reward": 0.125})
    assert table.splitlines()[2:] == ["| reward | 0.500 | 0.250 |", "| pass_at_k | 1.000 | - |",
                                      "| sampled_reward | - | 0.125 |"]
