"""The extension registries (configs/estimators.py, configs/reward_sources.py, configs/dpo_objectives.py):
the schema admits exactly their names, an entry registered later is picked up by the schema and the DAG,
and every entry has its implementation on the stages' side."""

from __future__ import annotations

import pytest

from configs import ConfigError, load_config
from configs.dpo_objectives import DPO_OBJECTIVES, DPOObjective
from configs.estimators import ESTIMATORS, Estimator
from configs.registry import Registry
from configs.reward_sources import REWARD_SOURCES, RewardSourceSpec
from configs.schema import PipelineConfig
from stages.dag.declaration import BY_NAME

REGISTRIES = {"rl.algorithm.advantage_estimator": ESTIMATORS, "reward.source": REWARD_SOURCES, "dpo.loss": DPO_OBJECTIVES}


@pytest.mark.parametrize("key", REGISTRIES)
def test_an_unknown_name_fails_in_one_line_listing_the_registered_names(key):
    with pytest.raises(ConfigError) as failed:
        load_config(None, [f"{key}=nope"])
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"override '{key}=nope': {key}: Input should be ")
    assert message.endswith("(got 'nope')") and all(repr(name) in message for name in REGISTRIES[key])


def test_the_unknown_name_message_reads_as_pydantics_for_a_literal():
    with pytest.raises(ConfigError) as failed:
        load_config(None, ["rl.algorithm.advantage_estimator=ppo"])
    assert str(failed.value) == ("override 'rl.algorithm.advantage_estimator=ppo': rl.algorithm.advantage_estimator: Input should be 'gae', "
                                 "'reinforce', 'reinforce_baseline', 'rloo', 'group_norm' or 'dr_grpo' (got 'ppo')")


def test_a_name_declared_twice_is_refused():
    with pytest.raises(ValueError, match="estimator 'gae' is declared twice"):
        Registry("advantage estimator", [Estimator("gae", "none"), Estimator("gae", "none")])


def test_a_registered_estimator_is_accepted_and_its_properties_apply(monkeypatch):
    with pytest.raises(ConfigError):
        load_config(None, ["rl.algorithm.advantage_estimator=toy"])
    monkeypatch.setitem(ESTIMATORS, "toy", Estimator("toy", "group_mean", needs_critic=True, grouped=True,
                                                      aggregation="seq_mean_token_mean"))
    rl = load_config(None, ["rl.algorithm.advantage_estimator=toy"]).rl
    assert (rl.algorithm.needs_critic, rl.algorithm.aggregation) == (True, "seq_mean_token_mean")
    with pytest.raises(ConfigError, match="advantage_estimator=toy compares samples of a prompt"):
        load_config(None, ["rl.algorithm.advantage_estimator=toy", "rl.rollout.n_samples_per_prompt=1"])
    monkeypatch.delitem(ESTIMATORS, "toy")
    with pytest.raises(ConfigError):
        load_config(None, ["rl.algorithm.advantage_estimator=toy"])


def test_a_registered_reward_source_is_accepted_and_the_dag_gives_it_the_model_it_consumes(monkeypatch):
    monkeypatch.setitem(REWARD_SOURCES, "rm_ensemble", RewardSourceSpec("rm_ensemble", paths=("rm_paths",),
                                                                        own_model="reward_model"))
    cfg = load_config(None, ["reward.source=rm_ensemble"])
    assert BY_NAME["rl"].wanted_inputs(cfg) == ("sft_model", "prompts", "eval_data", "reward_model")
    assert "reward_model" in BY_NAME["eval"].wanted_inputs(cfg)
    named = load_config(None, ["reward.source=rm_ensemble", "reward.rm_paths=[/models/rm]"])
    assert BY_NAME["rl"].wanted_inputs(named) == ("sft_model", "prompts", "eval_data")  # its own files instead


def test_a_registered_dpo_objective_is_accepted_and_its_options_are_its_own(monkeypatch):
    monkeypatch.setitem(DPO_OBJECTIVES, "toy", DPOObjective("toy", "sigmoid", options=("nll_loss_coef",)))
    assert PipelineConfig.model_validate({"dpo": {"loss": "toy", "nll_loss_coef": 0.5}}).dpo.loss == "toy"
    with pytest.raises(ValueError, match="nll_loss_coef needs loss: toy, not sigmoid"):
        PipelineConfig.model_validate({"dpo": {"nll_loss_coef": 0.5}})


@pytest.mark.parametrize(("overrides", "message"), [
    (["dpo.loss=ipo", "dpo.label_smoothing=0.1"], "dpo: Value error, label_smoothing needs loss: sigmoid, not ipo"),
    (["dpo.undesirable_weight=2"], "dpo: Value error, desirable_weight / undesirable_weight need loss: kto, not sigmoid"),
])
def test_an_option_of_another_objective_fails_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as failed:
        load_config(None, overrides)
    assert message in str(failed.value) and "\n" not in str(failed.value)


def test_the_defaults_are_registered():
    cfg = PipelineConfig()
    assert cfg.rl.algorithm.advantage_estimator in ESTIMATORS and cfg.reward.source in REWARD_SOURCES
    assert cfg.dpo.loss in DPO_OBJECTIVES


# --- every entry has its implementation in the stages ----------------------------------------


@pytest.mark.parametrize("name", ESTIMATORS)
def test_every_estimator_names_a_shaping(name):
    from stages.rl.advantages import SHAPINGS

    assert ESTIMATORS[name].shaping in SHAPINGS


@pytest.mark.parametrize("name", REWARD_SOURCES)
def test_every_reward_source_has_a_builder(name):
    from stages.rewards.factory import BUILDERS

    assert name in BUILDERS


@pytest.mark.parametrize("name", DPO_OBJECTIVES)
def test_every_dpo_objective_names_a_pair_loss(name):
    from stages.dpo.losses import PAIR_LOSSES

    assert DPO_OBJECTIVES[name].pair_loss in PAIR_LOSSES
