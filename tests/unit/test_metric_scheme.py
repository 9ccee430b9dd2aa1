"""The pipeline's metric names: the RL stage's step metrics under the scheme, and what a pipeline run
carries of its stages."""

import pytest

from configs import load_config
from stages.rl.step_metrics import step_metrics

RAW = {"reward": 0.5, "kl": 0.01, "response_length": 12.0, "reward_std": 0.2, "score": 0.4, "tokens": 900.0,
       "advantage_mean": 0.0, "rollout_logprob_gap": 1e-6, "kl_coef": 0.01, "filtered_groups": 0.0, "samples_per_s": 30.0,
       "actor/entropy": 3.1, "actor/lr": 1e-4, "critic/value_loss": 0.2, "reward/answered": 0.9, "time/weight_sync": 0.0,
       "time/training": 1.5}


def rl_section(*overrides):
    return load_config(None, list(overrides)).rl


def test_rl_step_metrics_put_the_headline_curves_under_train_and_drop_what_the_config_fixes():
    named = step_metrics(RAW, rl_section("rl.rollout.engine=hybrid"))
    assert named == {"train/reward": 0.5, "train/kl": 0.01, "train/response_length": 12.0, "rollout/reward_std": 0.2,
                     "rollout/score": 0.4, "rollout/tokens": 900.0, "rollout/advantage_mean": 0.0,
                     "rollout/logprob_gap": 1e-6, "rollout/samples_per_s": 30.0, "actor/entropy": 3.1,
                     "critic/value_loss": 0.2, "reward/answered": 0.9, "time/training": 1.5}


@pytest.mark.parametrize(("override", "kept"), [("rl.algorithm.kl_target=0.05", "rollout/kl_coef"),
                                            ("rl.algorithm.dynamic_filtering=true", "rollout/filtered_groups"),
                                            ("rl.rollout.engine=hf", "time/weight_sync"),
                                            ("rl.actor.warmup_ratio=0.1", "actor/lr")])
def test_rl_step_metrics_keep_a_series_the_config_lets_vary(override, kept):
    named = step_metrics(RAW, rl_section("rl.rollout.engine=hybrid", override) if override != "rl.rollout.engine=hf" else rl_section(override))
    assert kept in named
    assert len(named) == 14  # the 13 above and this one


def test_every_stage_key_metric_follows_the_scheme():
    from stages.dag.declaration import STAGES

    assert {s.name: s.key_metric.partition("/")[0] for s in STAGES} == {
        "data_prep": "rows", "sft": "eval", "rm": "eval", "prm": "eval", "rl": "eval", "dpo": "eval", "rs": "eval", "kd": "eval", "csft": "eval",
        "lora_merge": "merge", "eval": "score"}


def test_a_pipeline_run_carries_each_stages_results_not_its_training_series():
    from flows.run_views import headline_metrics

    sft = {"train/loss": 0.4, "train/lr": 1e-3, "eval/loss": 0.5, "time/compute_s": 9.0, "system/cpu_utilization_percentage": 80.0}
    assert headline_metrics("sft", sft) == {"sft/eval/loss": 0.5, "sft/time/compute_s": 9.0}
    rl = {"train/reward": 0.7, "rollout/tokens": 10.0, "actor/entropy": 2.0, "eval/reward": 0.8, "eval/accuracy": 0.9}
    assert headline_metrics("rl", rl) == {"rl/eval/accuracy": 0.9, "rl/eval/reward": 0.8}
    ev = {"score": 0.8, "sft/accuracy": 0.9, "rl/sampled_accuracy": 0.7, "time/compute_s": 3.0, "system/disk_usage_megabytes": 1.0}
    assert headline_metrics("eval", ev) == {"eval/rl/sampled_accuracy": 0.7, "eval/score": 0.8, "eval/sft/accuracy": 0.9,
                                            "eval/time/compute_s": 3.0}
    assert headline_metrics("data_prep", {"rows/sft_data/train": 200.0}) == {"data_prep/rows/sft_data/train": 200.0}
    assert headline_metrics("lora_merge", {"merge/max_logit_diff": 1e-6, "merge/models": 1.0}) == {
        "lora_merge/merge/max_logit_diff": 1e-6, "lora_merge/merge/models": 1.0}


@pytest.mark.parametrize(("statuses", "phrase"), [
    ({"data_prep": "ran", "sft": "ran", "eval": "ran"}, "3 ran"),
    ({"data_prep": "cached", "sft": "cached"}, "all cached"),
    ({"data_prep": "cached", "rm": "ran", "eval": "cached"}, "1 ran, 2 cached"),
    ({"data_prep": "cached", "rl": "failed", "dpo": "ran"}, "failed at rl"),
    ({"sft": "cached", "rl": "interrupted", "dpo": "interrupted", "rm": "failed"}, "stopped during rl, dpo"),
    ({}, "nothing to run"),
])
def test_a_pipeline_run_is_named_by_its_config_and_what_happened(statuses, phrase):
    from flows.run_views import pipeline_run_name

    assert pipeline_run_name(("tiny", ""), statuses) == f"tiny · {phrase}"
    assert pipeline_run_name(("tiny", "rm.max_steps=15"), statuses) == f"tiny · {phrase} · rm.max_steps=15"


def test_run_names_before_the_outcome_and_for_stages_and_long_overrides():
    from flows.run_views import OVERRIDES_WIDTH, config_label, pipeline_run_name, stage_run_name

    assert pipeline_run_name(config_label("tiny", None)) == "tiny · running"
    # what was asked is in the name: a reused-everything `--only rm` is not a whole cached run
    assert pipeline_run_name(config_label("tiny", ["rm.lr=1e-4"], force=["sft"], only=["rm", "dpo"]),
                             {"rm": "cached"}) == "tiny · all cached · --only rm,dpo --force sft rm.lr=1e-4"
    assert stage_run_name("sft", config_label("tiny", ["sft.lr=1e-3"])) == "sft · tiny · sft.lr=1e-3"
    config, overrides = config_label("tiny", [f"rl.key{i}=1" for i in range(20)])
    assert len(overrides) == OVERRIDES_WIDTH and overrides.endswith("…") and config == "tiny"
