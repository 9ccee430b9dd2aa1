"""The RL layout chosen and checked before any stage runs: `rl.rollout.engine: auto` against the cluster's size,
and one line when a layout the config fixes can never be placed."""

import pytest

from configs import ConfigError, PipelineError, load_config
from configs.schema import PipelineConfig
from stages.dag.preflight import check_local_resources, with_rl_layout
from stages.rl.layout import Role, bundles_needed, check_fits, pools, resolve_layout


def defaults(**sections) -> PipelineConfig:
    """The schema's defaults (what a config naming only model, data and reward gets), plus `sections`."""
    return PipelineConfig.model_validate(sections)


def test_auto_keeps_openrlhfs_separate_layout_where_every_group_gets_bundles():
    cfg = resolve_layout(defaults(), cpus=16, gpus=0)
    assert (cfg.rl.rollout.engine, cfg.rl.placement.colocate_all) == ("hf", False)
    assert bundles_needed(cfg, needs_critic=False) == (8, 0)  # policy, engine, reward, reference: 2 CPUs each


def test_auto_on_a_small_machine_samples_in_the_policy_ranks_with_every_group_colocated():
    cfg = resolve_layout(defaults(), cpus=2, gpus=0)
    assert (cfg.rl.rollout.engine, cfg.rl.placement.colocate_all) == ("hybrid", True)
    assert bundles_needed(cfg, needs_critic=False) == (2, 0)
    check_fits(cfg, 2, 0, "the local Ray cluster")


def test_auto_with_zero3_colocates_an_hf_engine():
    cfg = resolve_layout(defaults(infra={"zero_stage": 3}), cpus=2, gpus=0)
    assert (cfg.rl.rollout.engine, cfg.rl.placement.colocate_all) == ("hf", True)


def test_auto_counts_gpus_when_workers_take_them():
    cfg = defaults(infra={"gpus_per_worker": 1, "cpus_per_worker": 1})
    assert resolve_layout(cfg, cpus=64, gpus=4).rl.rollout.engine == "hf"
    assert resolve_layout(cfg, cpus=64, gpus=1).rl.rollout.engine == "hybrid"


def test_auto_leaves_a_colocation_the_config_states():
    cfg = resolve_layout(defaults(rl={"placement": {"colocate_all": False}}), cpus=2, gpus=0)
    assert (cfg.rl.rollout.engine, cfg.rl.placement.colocate_all) == ("hybrid", False)
    with pytest.raises(PipelineError, match=r"stage rl needs 4 CPU / 0 GPU .* the local Ray cluster has 2 CPU"):
        check_fits(cfg, 2, 0, "the local Ray cluster")


def test_a_named_engine_is_kept_and_a_layout_that_cannot_fit_fails_in_one_line():
    cfg = resolve_layout(defaults(rl={"rollout": {"engine": "hf"}}), cpus=2, gpus=0)
    assert (cfg.rl.rollout.engine, cfg.rl.placement.colocate_all) == ("hf", False)
    with pytest.raises(PipelineError) as failed:
        check_fits(cfg, 2, 0, "the local Ray cluster (infra.num_cpus)")
    message = str(failed.value)
    assert "\n" not in message and "rl.rollout.engine=hf" in message and "set rl.rollout.engine: auto" in message
    assert "actor groups [['actor'], ['engine'], ['reward'], ['ref']]" in message  # the roles by name


def test_preflight_checks_the_rl_layout_on_the_local_cluster():
    check_local_resources(defaults(infra={"num_cpus": 2}))  # auto: fits as hybrid
    with pytest.raises(PipelineError, match="stage rl needs 8 CPU"):
        check_local_resources(defaults(infra={"num_cpus": 2}, rl={"rollout": {"engine": "hf"}}))
    pinned = defaults(infra={"num_cpus": 2}, rl={"rollout": {"engine": "hf"}}, inputs={"rl_model": "models:/rl_model/1"})
    check_local_resources(pinned)  # RL does not run: its layout does not matter


def test_a_named_cluster_resolves_auto_in_the_stage(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://cluster:10001")
    assert with_rl_layout(defaults(infra={"num_cpus": 2})).rl.rollout.engine == "auto"


def test_the_preset_fixes_its_layout():
    cfg = load_config(None)
    assert resolve_layout(cfg, cpus=64, gpus=0) is cfg


def test_engine_auto_is_not_an_unknown_value():
    with pytest.raises(ConfigError, match=r"rl.rollout.engine"):
        load_config(None, ["rl.rollout.engine=fast"])


def test_async_training_needs_engines_that_can_generate_while_the_policy_trains():
    from stages.rl.in_process import layout as in_process_layout
    from stages.rl.layout import check_async

    asked = {"rollout": {"async_train": True}}
    with pytest.raises(PipelineError, match=r"^rl.rollout.async_train: with rl.rollout.engine=hybrid the policy ranks sample themselves"):
        check_async(defaults(rl={"rollout": {"async_train": True, "engine": "hybrid"}}))
    with pytest.raises(PipelineError, match=r"^rl.rollout.async_train: rl.placement.colocate_all puts the rollout engines on the policy's bundles"):
        check_async(defaults(rl={"rollout": {"async_train": True, "engine": "hf"}, "placement": {"colocate_all": True}}))
    with pytest.raises(ConfigError, match=r"^rl.rollout.async_train: a one-process RL run calls its workers one after another"):
        in_process_layout(defaults(rl=asked))
    # auto keeps engine actors of their own rather than falling back to the hybrid layout, and says what fits
    small = resolve_layout(defaults(rl=asked | {"placement": {"colocate_actor_ref": True}}), cpus=2, gpus=0)
    assert (small.rl.rollout.engine, small.rl.placement.colocate_all) == ("hf", False)
    check_async(small)
    with pytest.raises(PipelineError, match=r"rl.rollout.async_train keeps the engines on bundles of their own: set rl.placement.colocate_models"):
        check_fits(small, 2, 0, "the local Ray cluster")
    two = resolve_layout(defaults(rl=asked | {"placement": {"colocate_models": True}}, infra={"cpus_per_worker": 1}), cpus=2, gpus=0)
    assert pools(two, [Role.ACTOR, Role.REF, Role.REWARD, Role.ENGINE]) == [[Role.ACTOR, Role.REF, Role.REWARD], [Role.ENGINE]]
    check_fits(two, 2, 0, "the local Ray cluster")
    check_async(two)


def test_async_training_weighs_stale_samples_by_the_default_cap_unless_one_is_set():
    assert defaults().rl.importance_cap is None
    assert defaults(rl={"rollout": {"async_train": True}}).rl.importance_cap == 2.0
    assert defaults(rl={"rollout": {"async_train": True}, "algorithm": {"rollout_is_cap": 5.0}}).rl.importance_cap == 5.0
    # the sampler's log-probs stand in for the old ones: PPO's ratio is already against the sampling policy
    assert defaults(rl={"rollout": {"async_train": True}, "algorithm": {"recompute_old_log_probs": False}}).rl.importance_cap is None
