"""The critic's start (rl.critic.init_from, OpenRLHF's --critic.model_name_or_path) and its saved value network
(rl.critic.save_value_network): the config's checks, what the DAG gives and takes, the pre-run check, and the
reward model's head as the critic's with its normalization folded in."""

import pytest
import torch

from configs import ConfigError, load_config
from configs.schema import PipelineConfig
from stages.dag import declaration as dag
from stages.dag.preflight import check_critic_start
from stages.rewards.rm_scorer import RewardHead

GAE = "rl.algorithm.advantage_estimator=gae"
FILES = {"source": "files", "sft": {"paths": ["x.jsonl"]}, "prompts": {"paths": ["y.jsonl"]}}


@pytest.mark.parametrize("setting", ["rl.critic.init_from=reward_model", "rl.critic.save_value_network=true",
                                     "rl.critic.freezing_steps=1"])
def test_a_critic_key_without_a_critic_is_a_one_line_error(setting):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rl.algorithm.advantage_estimator=group_norm", setting])
    key = setting.split("=")[0]
    assert f"{key} acts on the critic, and advantage_estimator=group_norm has none; use gae or leave {key} at its default" \
        in str(err.value) and "\n" not in str(err.value)


def test_init_path_goes_with_init_from_path_and_saving_refuses_a_4bit_base():
    with pytest.raises(ConfigError, match="rl.critic.init_path names the critic's starting checkpoint exactly when "
                                          r"rl.critic.init_from: path \(set both, or neither\)"):
        load_config(None, [GAE, "rl.critic.init_from=path"])
    with pytest.raises(ConfigError, match=r"exactly when rl.critic.init_from: path"):
        load_config(None, [GAE, "rl.critic.init_path=/rm"])
    assert load_config(None, [GAE, "rl.critic.init_from=path", "rl.critic.init_path=/rm"]).rl.critic.init_path == "/rm"
    with pytest.raises(ConfigError, match=r"rl.critic.save_value_network saves the critic with its adapters merged, which a "
                                          r"4-bit base \(rl.critic.lora.load_in_4bit\) cannot take"):
        load_config(None, [GAE, "rl.critic.save_value_network=true", "rl.critic.lora.rank=4", "rl.critic.lora.load_in_4bit=true"])


def test_the_critic_starts_from_the_sft_model_unless_asked():
    critic = PipelineConfig().rl.critic
    assert (critic.init_from, critic.init_path, critic.save_value_network) == ("sft", None, False)


def test_rl_takes_the_reward_model_when_its_critic_starts_from_it_whatever_scores():
    rl = dag.BY_NAME["rl"]
    from_rm = load_config(None, [GAE, "rl.critic.init_from=reward_model"])  # the preset's reward: a rule function
    assert from_rm.reward.source == "func" and "reward_model" in rl.wanted_inputs(from_rm)
    assert "reward_model" not in rl.wanted_inputs(load_config(None, [GAE]))
    assert "reward_model" in rl.wanted_inputs(load_config(None, [GAE, "reward.source=rm"]))  # the reward's, as before
    assert "rm" in dag.needed_by(["rl"], from_rm)
    # a path is the critic's own: fingerprinted by content, not an input
    at_path = load_config(None, [GAE, "rl.critic.init_from=path", "rl.critic.init_path=/rm"])
    assert "reward_model" not in rl.wanted_inputs(at_path) and "rl.critic.init_path" in rl.local_sources


def test_the_saved_critic_is_an_optional_registered_output_that_a_pinned_policy_does_not_wait_for():
    rl = dag.BY_NAME["rl"]
    assert "critic_model" in rl.outputs and "critic_model" in rl.optional_outputs and "critic_model" in rl.register
    saving = load_config(None, [GAE, "rl.critic.save_value_network=true", "inputs.rl_model=models:/rlhf-rl/1"])
    assert dag.pinned_away(rl, saving)  # the pinned policy stands in; its critic is not made
    assert not dag.pinned_away(rl, load_config(None, [GAE]))


def test_a_critic_from_a_reward_model_the_pipeline_does_not_have_stops_the_run_in_one_line():
    cfg = PipelineConfig.model_validate({"data": FILES, "rl": {"algorithm": {"advantage_estimator": "gae"},
                                                               "critic": {"init_from": "reward_model"}}})
    with pytest.raises(ConfigError) as failed:
        check_critic_start(cfg)
    assert str(failed.value) == (
        "rl.critic.init_from=reward_model: the critic starts from the pipeline's reward model, and this pipeline has "
        "none (without data.preference the rm stage trains none); set data.preference or inputs.reward_model, or "
        "rl.critic.init_from: path with rl.critic.init_path, or rl.critic.init_from: sft")
    check_critic_start(cfg.model_copy(update={"inputs": {"reward_model": "models:/rlhf-reward/1"}}))
    check_critic_start(cfg, only=["sft"])  # rl does not run
    check_critic_start(load_config(None, [GAE, "rl.critic.init_from=reward_model"]))  # the synthetic task has pairs


def test_an_init_path_that_is_no_checkpoint_stops_the_run_in_one_line(tmp_path):
    from configs.errors import CheckpointError

    cfg = load_config(None, [GAE, "rl.critic.init_from=path", f"rl.critic.init_path={tmp_path / 'nowhere'}"])
    with pytest.raises(CheckpointError, match=r"^rl.critic.init_path=.*nowhere: no such directory"):
        check_critic_start(cfg)


def head(weight: list[float], bias: float | None) -> torch.nn.Linear:
    linear = torch.nn.Linear(len(weight), 1, bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([weight]))
        if bias is not None and linear.bias is not None:
            linear.bias.fill_(bias)
    return linear


@pytest.mark.parametrize(("normalize", "bias", "weight", "offset"), [
    # w = (2, 4), b = 1, mean 3, std 2: w / std = (1, 2), (b - mean) / std = (1 - 3) / 2 = -1
    (True, 1.0, [1.0, 2.0], -1.0),
    # no bias (the rm stage's heads): (0 - 3) / 2 = -1.5
    (True, None, [1.0, 2.0], -1.5),
    # a checkpoint that does not normalize: the head as it is, a zero offset where it has no bias
    (False, None, [2.0, 4.0], 0.0),
])
def test_the_reward_heads_normalization_folds_into_the_critics_head(normalize, bias, weight, offset):
    folded = RewardHead(head([2.0, 4.0], bias), normalize, mean=3.0, std=2.0).scoring()
    assert folded.weight.tolist() == [weight] and folded.bias.tolist() == [offset]
    # on h = (1, 1): the RM reads 2 + 4 + b = 7 (b = 1) or 6, normalized (7 - 3) / 2 = 2 or (6 - 3) / 2 = 1.5
    h = torch.ones(1, 2)
    expected = {(True, 1.0): 2.0, (True, None): 1.5, (False, None): 6.0}[(normalize, bias)]
    assert folded(h).item() == expected


def test_an_extreme_std_folds_without_overflow():
    folded = RewardHead(head([1e-3, -1e-3], None), True, mean=1e6, std=1e-6).scoring()
    assert folded.weight[0].tolist() == pytest.approx([1e3, -1e3], rel=1e-6)  # 1e-3 / 1e-6
    assert folded.bias.item() == pytest.approx(-1e12, rel=1e-6)  # (0 - 1e6) / 1e-6, finite in float32
