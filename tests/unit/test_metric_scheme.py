"""The pipeline's metric names: the RL stage's step metrics under the scheme, and what a pipeline run
carries of its stages."""

import pytest

from configs import load_config
from stages.rl.step_metrics import step_metrics

RAW = {"reward": 0.5, "kl": 0.01, "response_length": 12.0, "reward_std": 0.2, "score": 0.4, "tokens": 900.0,
       "advantage_mean": 0.0, "rollout_logprob_gap": 1e-6, "kl_coef": 0.01, "filtered_groups": 0.0, "samples_per_s": 30.0,
       "actor/entropy": 3.1, "critic/value_loss": 0.2, "reward/answered": 0.9, "time/weight_sync": 0.0, "time/training": 1.5}


def rl_section(*overrides):
    return load_config(None, list(overrides)).rl


def test_rl_step_metrics_put_the_headline_curves_under_train_and_drop_what_the_config_fixes():
    named = step_metrics(RAW, rl_section("rl.engine=hybrid"))
    assert named == {"train/reward": 0.5, "train/kl": 0.01, "train/response_length": 12.0, "rollout/reward_std": 0.2,
                     "rollout/score": 0.4, "rollout/tokens": 900.0, "rollout/advantage_mean": 0.0,
                     "rollout/logprob_gap": 1e-6, "rollout/samples_per_s": 30.0, "actor/entropy": 3.1,
                     "critic/value_loss": 0.2, "reward/answered": 0.9, "time/training": 1.5}


@pytest.mark.parametrize("override, kept", [("rl.kl_target=0.05", "rollout/kl_coef"),
                                            ("rl.dynamic_filtering=true", "rollout/filtered_groups"),
                                            ("rl.engine=hf", "time/weight_sync")])
def test_rl_step_metrics_keep_a_series_the_config_lets_vary(override, kept):
    named = step_metrics(RAW, rl_section("rl.engine=hybrid", override) if override != "rl.engine=hf" else rl_section(override))
    assert kept in named
    assert len(named) == 14  # the 13 above and this one
