"""The rl config section: consistency checks, derived settings, actor placement pools."""

import pytest

from configs import ConfigError, load_config
from configs.estimators import ESTIMATORS
from configs.schema import RL_MOVED, RL_SECTIONS, InfraConfig, PipelineConfig, RLConfig, TrainingConfig
from runtime.rl_placement import Slot, waves
from stages.common.deepspeed_engine import engine_config
from stages.rl.layout import group_sizes, pools

GROUPED = [n for n, e in ESTIMATORS.items() if e.grouped]
UNGROUPED = [n for n, e in ESTIMATORS.items() if not e.grouped]


@pytest.mark.parametrize("estimator", GROUPED)
def test_group_estimators_need_several_samples_per_prompt(estimator):
    with pytest.raises(ConfigError, match=f"advantage_estimator={estimator} compares samples of a prompt"):
        load_config(None, [f"rl.algorithm.advantage_estimator={estimator}", "rl.rollout.n_samples_per_prompt=1"])


@pytest.mark.parametrize("estimator", UNGROUPED)
def test_single_sample_estimators_accept_one_sample(estimator):
    cfg = load_config(None, [f"rl.algorithm.advantage_estimator={estimator}", "rl.rollout.n_samples_per_prompt=1",
                             "rl.rollout.batch_size=64", "rl.train_batch_size=64"])
    assert cfg.rl.rollout.n_samples_per_prompt == 1


@pytest.mark.parametrize("estimator", GROUPED)
def test_group_estimators_refuse_a_discount(estimator):
    with pytest.raises(ConfigError, match="override 'rl.algorithm.gamma=0.9': rl.algorithm: .*rl.algorithm.gamma=0.9 "
                                          f"with advantage_estimator={estimator}: "
                                          "a group estimator scores whole responses, undiscounted"):
        load_config(None, [f"rl.algorithm.advantage_estimator={estimator}", "rl.algorithm.gamma=0.9"])


@pytest.mark.parametrize("estimator", UNGROUPED)
def test_discount_applies_to_estimators_that_compare_no_samples(estimator):
    assert load_config(None, [f"rl.algorithm.advantage_estimator={estimator}", "rl.algorithm.gamma=0.9"]).rl.algorithm.gamma == 0.9


def test_batch_sizes_must_divide():
    with pytest.raises(ConfigError, match=r"must be a multiple of rl.train_batch_size"):
        load_config(None, ["rl.train_batch_size=48"])
    with pytest.raises(ConfigError, match=r"multiple of rl.micro_train_batch_size x rl.actor.num_workers"):
        load_config(None, ["rl.actor.num_workers=3"])


def test_importance_weights_need_recomputed_old_log_probs():
    with pytest.raises(ConfigError, match=r"rl.algorithm.rollout_is_cap .* needs rl.algorithm.recompute_old_log_probs: true"):
        load_config(None, ["rl.algorithm.rollout_is_cap=2", "rl.algorithm.recompute_old_log_probs=false"])
    assert load_config(None, ["rl.algorithm.recompute_old_log_probs=false"]).rl.algorithm.recompute_old_log_probs is False


def test_a_key_of_the_flat_rl_layout_names_where_it_went(tmp_path):
    """The rl section has sections (rollout, algorithm, placement, agent): a flat key, in an override or a
    preset, is refused with its new name, and every old key has one."""
    with pytest.raises(ConfigError, match=r"^override 'rl.temperature=0.5': rl.temperature is now rl.rollout.temperature$"):
        load_config(None, ["rl.temperature=0.5"])
    with pytest.raises(ConfigError, match=r"rl.rollout_batch_size is now rl.rollout.batch_size$"):
        load_config(None, ["rl.rollout_batch_size=8"])
    preset = tmp_path / "old.yaml"
    preset.write_text("rl:\n  colocate_all: true\n")
    with pytest.raises(ConfigError, match=r"old.yaml: rl: .*rl.colocate_all is now rl.placement.colocate_all"):
        load_config(str(preset))
    for old, new in RL_MOVED.items():
        section, name = new.split(".")
        assert name in RL_SECTIONS[section].model_fields and old not in RLConfig.model_fields


def test_unknown_rl_key_is_named():
    with pytest.raises(ConfigError, match=r"rl.clip_eps"):
        load_config(None, ["rl.clip_eps=0.1"])


def test_loss_aggregation_defaults_per_estimator():
    assert PipelineConfig().rl.algorithm.aggregation == "token_mean"
    dr = PipelineConfig.model_validate({"rl": {"algorithm": {"advantage_estimator": "dr_grpo"}}})
    assert dr.rl.algorithm.aggregation == "seq_mean_token_sum_norm"
    chosen = PipelineConfig.model_validate({"rl": {"algorithm": {"advantage_estimator": "dr_grpo", "loss_aggregation": "token_mean"}}})
    assert chosen.rl.algorithm.aggregation == "token_mean"


def test_reference_model_only_with_a_kl_coefficient():
    assert PipelineConfig().rl.algorithm.needs_reference
    assert not PipelineConfig.model_validate({"rl": {"algorithm": {"init_kl_coef": 0}}}).rl.algorithm.needs_reference


def test_group_sizes_and_pools():
    cfg = PipelineConfig.model_validate({"rl": {"actor": {"num_workers": 2}, "micro_train_batch_size": 16}})
    assert group_sizes(cfg, needs_critic=True) == {"actor": 2, "engine": 1, "reward": 1, "ref": 1, "critic": 1}
    groups = list(group_sizes(cfg, needs_critic=True))
    assert pools(cfg, groups) == [["actor"], ["engine"], ["reward"], ["ref"], ["critic"]]
    placement = cfg.rl.placement.model_copy(update={"colocate_actor_ref": True, "colocate_critic_reward": True})
    paired = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"placement": placement})})
    assert pools(paired, groups) == [["actor", "ref"], ["critic", "reward"], ["engine"]]
    together = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"placement": cfg.rl.placement.model_copy(update={"colocate_all": True})})})
    assert pools(together, groups) == [groups]


def test_the_hybrid_engine_has_no_engine_or_reference_group_and_needs_whole_weights():
    cfg = PipelineConfig.model_validate({"rl": {"rollout": {"engine": "hybrid"}}, "infra": {"zero_stage": 2}})
    assert cfg.rl.algorithm.needs_reference  # the policy ranks hold it
    assert group_sizes(cfg, needs_critic=True) == {"actor": 1, "reward": 1, "critic": 1}
    with pytest.raises(ConfigError, match=r"tiny.yaml: .*rl.rollout.engine=hybrid .* use infra.zero_stage 0, 1 or 2"):
        load_config(None, ["rl.rollout.engine=hybrid", "infra.zero_stage=3"])
    with pytest.raises(ConfigError, match=r"rl.rollout.engine=hybrid keeps the reference in each policy rank: rl.placement.ref_num_workers"):
        load_config(None, ["rl.rollout.engine=hybrid", "rl.placement.ref_num_workers=2"])


def test_reference_and_reward_groups_take_their_worker_counts_and_must_split_the_rollout():
    cfg = PipelineConfig.model_validate({"rl": {"placement": {"ref_num_workers": 2, "reward_num_workers": 3}}})
    assert group_sizes(cfg, needs_critic=False) == {"actor": 1, "engine": 1, "reward": 3, "ref": 2}
    with pytest.raises(ValueError, match=r"multiple of rl.placement.ref_num_workers"):
        PipelineConfig.model_validate({"rl": {"placement": {"ref_num_workers": 3}}})  # 32 prompts x 4 samples


def test_groups_that_share_cores_take_turns_the_others_run_at_once():
    experience = ["actor", "ref", "critic"]
    assert waves([experience], experience) == [["actor"], ["ref"], ["critic"]]  # colocate_all
    assert waves([["actor", "ref"], ["critic", "reward"]], experience) == [["actor", "critic"], ["ref"]]
    assert waves([["actor"], ["ref"], ["critic"]], experience) == [experience]  # nothing shared
    # hybrid: the reference runs in the policy ranks, so it shares their cores with a colocated critic
    hybrid_pools = [["actor", "reward", "critic"]]
    assert waves(hybrid_pools, ["ref", "critic"], {"ref": "actor"}) == [["ref"], ["critic"]]
    # the policy's old log-probs and the reference's go to the same ranks, which queue them
    assert waves(hybrid_pools, experience, {"ref": "actor"}) == [["actor", "ref"], ["critic"]]
    assert waves([["actor"], ["reward"], ["critic"]], ["ref", "critic"], {"ref": "actor"}) == [["ref", "critic"]]


def test_an_actor_sharing_its_cores_starts_with_as_many_threads_as_they_are():
    # a quarter of 2 cores: Ray alone would start the process with OMP_NUM_THREADS=1
    options = Slot(pg=None, bundle=0, num_cpus=0.5, num_gpus=0.0, threads=2).options()
    assert options["num_cpus"] == 0.5
    assert options["runtime_env"] == {"env_vars": {"OMP_NUM_THREADS": "2"}}


def test_tiny_preset_rl_fits_two_cpus():
    cfg = load_config(None)
    assert cfg.rl.placement.colocate_all and cfg.infra.cpus_per_worker <= 2


def test_engine_config_has_no_scheduler_for_a_constant_lr():
    const = engine_config(InfraConfig(), TrainingConfig(warmup_ratio=0.0, min_lr_ratio=1.0), 100)
    assert "scheduler" not in const
    decayed = engine_config(InfraConfig(), TrainingConfig(warmup_ratio=0.1, min_lr_ratio=0.1), 100)
    assert decayed["scheduler"]["params"]["warmup_num_steps"] == 10


def test_the_moving_average_is_the_policys_with_a_beta_in_zero_to_one():
    assert load_config(None, []).rl.actor.ema_beta is None  # off, as OpenRLHF's --enable_ema
    assert load_config(None, ["rl.actor.ema_beta=0"]).rl.actor.ema_beta == 0.0
    with pytest.raises(ConfigError, match=r"rl.actor.ema_beta: Input should be less than or equal to 1"):
        load_config(None, ["rl.actor.ema_beta=1.5"])
    with pytest.raises(ConfigError, match=r"unknown key 'rl.critic.ema_beta'"):
        load_config(None, ["rl.critic.ema_beta=0.9"])


def test_the_best_metric_must_be_one_the_evals_report_and_rank_by():
    assert load_config("tiny", ["rl.best_metric=accuracy"]).rl.best_metric == "accuracy"
    with pytest.raises(ConfigError, match=r"rl.best_metric=accuracy checks answers with eval.answer_pattern, which is empty: "
                                          r"set eval.answer_pattern or use rl.best_metric=reward"):
        load_config("tiny", ["rl.best_metric=accuracy", "eval.answer_pattern=null", "eval.metric=reward"])
    with pytest.raises(ConfigError, match=r"rl.best_metric=sampled_reward needs sampled responses: eval.samples_per_prompt "
                                          r"must be > 0"):
        load_config("tiny", ["rl.best_metric=sampled_reward", "eval.samples_per_prompt=0", "eval.metric=reward"])
    with pytest.raises(ConfigError, match=r"rl.best_metric: Value error, response_length is reported but ranks no model"):
        load_config(None, ["rl.best_metric=response_length"])
    with pytest.raises(ConfigError, match=r"rl.max_checkpoints: Input should be greater than 0"):
        load_config(None, ["rl.max_checkpoints=0"])
