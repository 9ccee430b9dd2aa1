"""The RL layout chosen and checked before any stage runs: `rl.engine: auto` against the cluster's size,
and one line when a layout the config fixes can never be placed."""

import pytest

from configs import ConfigError, PipelineError, load_config
from configs.schema import PipelineConfig
from stages.preflight import check_local_resources, with_rl_layout
from stages.rl.layout import bundles_needed, check_fits, resolve_layout


def defaults(**sections) -> PipelineConfig:
    """The schema's defaults (what a config naming only model, data and reward gets), plus `sections`."""
    return PipelineConfig.model_validate(sections)


def test_auto_keeps_openrlhfs_separate_layout_where_every_group_gets_bundles():
    cfg = resolve_layout(defaults(), cpus=16, gpus=0)
    assert (cfg.rl.engine, cfg.rl.colocate_all) == ("hf", False)
    assert bundles_needed(cfg, needs_critic=False) == (8, 0)  # policy, engine, reward, reference: 2 CPUs each


def test_auto_on_a_small_machine_samples_in_the_policy_ranks_with_every_group_colocated():
    cfg = resolve_layout(defaults(), cpus=2, gpus=0)
    assert (cfg.rl.engine, cfg.rl.colocate_all) == ("hybrid", True)
    assert bundles_needed(cfg, needs_critic=False) == (2, 0)
    check_fits(cfg, 2, 0, "the local Ray cluster")


def test_auto_with_zero3_colocates_an_hf_engine():
    cfg = resolve_layout(defaults(infra={"zero_stage": 3}), cpus=2, gpus=0)
    assert (cfg.rl.engine, cfg.rl.colocate_all) == ("hf", True)


def test_auto_counts_gpus_when_workers_take_them():
    cfg = defaults(infra={"gpus_per_worker": 1, "cpus_per_worker": 1})
    assert resolve_layout(cfg, cpus=64, gpus=4).rl.engine == "hf"
    assert resolve_layout(cfg, cpus=64, gpus=1).rl.engine == "hybrid"


def test_auto_leaves_a_colocation_the_config_states():
    cfg = resolve_layout(defaults(rl={"colocate_all": False}), cpus=2, gpus=0)
    assert (cfg.rl.engine, cfg.rl.colocate_all) == ("hybrid", False)
    with pytest.raises(PipelineError, match=r"stage rl needs 4 CPU / 0 GPU .* the local Ray cluster has 2 CPU"):
        check_fits(cfg, 2, 0, "the local Ray cluster")


def test_a_named_engine_is_kept_and_a_layout_that_cannot_fit_fails_in_one_line():
    cfg = resolve_layout(defaults(rl={"engine": "hf"}), cpus=2, gpus=0)
    assert (cfg.rl.engine, cfg.rl.colocate_all) == ("hf", False)
    with pytest.raises(PipelineError) as failed:
        check_fits(cfg, 2, 0, "the local Ray cluster (infra.num_cpus)")
    message = str(failed.value)
    assert "\n" not in message and "rl.engine=hf" in message and "set rl.engine: auto" in message
    assert "actor groups [['actor'], ['engine'], ['reward'], ['ref']]" in message  # the roles by name


def test_preflight_checks_the_rl_layout_on_the_local_cluster():
    check_local_resources(defaults(infra={"num_cpus": 2}))  # auto: fits as hybrid
    with pytest.raises(PipelineError, match="stage rl needs 8 CPU"):
        check_local_resources(defaults(infra={"num_cpus": 2}, rl={"engine": "hf"}))
    pinned = defaults(infra={"num_cpus": 2}, rl={"engine": "hf"}, inputs={"rl_model": "models:/rl_model/1"})
    check_local_resources(pinned)  # RL does not run: its layout does not matter


def test_a_named_cluster_resolves_auto_in_the_stage(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://cluster:10001")
    assert with_rl_layout(defaults(infra={"num_cpus": 2})).rl.engine == "auto"


def test_the_preset_fixes_its_layout():
    cfg = load_config(None)
    assert resolve_layout(cfg, cpus=64, gpus=0) is cfg


def test_engine_auto_is_not_an_unknown_value():
    with pytest.raises(ConfigError, match="rl.engine"):
        load_config(None, ["rl.engine=fast"])
