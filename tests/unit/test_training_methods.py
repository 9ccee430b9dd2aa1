"""The pure parts of the training methods beside SFT, RL and DPO: rejection sampling's best-of-n filter."""

import pytest
import torch

from stages.rejection_sampling import best_of_n


@pytest.mark.parametrize("rewards, threshold, expected", [
    ([[0.0, 1.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0], [-3.0, -1.0, -2.0, -1.5]], None, [1, 0, 1]),  # ties: the first
    ([[0.0, 1.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0], [-3.0, -1.0, -2.0, -1.5]], 1.0, [1, 0, None]),  # at the threshold: kept
    ([[0.0, 1.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0], [-3.0, -1.0, -2.0, -1.5]], 1.5, [None, 0, None]),
    ([[0.0, 0.0], [0.0, 1.0]], 1.0, [None, 1]),  # 0/1 rewards: only prompts with a correct sample
    ([[float("-inf"), -1e30]], -1e31, [1]),
])
def test_best_of_n_keeps_each_prompts_first_best_sample_at_or_above_the_threshold(rewards, threshold, expected):
    assert best_of_n(torch.tensor(rewards), threshold) == expected
