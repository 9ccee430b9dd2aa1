"""The overrides a deployment run takes: data and hyperparameters, never a key that runs or chooses code
unless the config file on the worker sets it to the same value."""

from __future__ import annotations

import pytest

from configs.errors import ConfigError
from configs.loader import preset_path
from configs.remote_overrides import refuse_code_overrides, refuse_other_config

pytestmark = pytest.mark.timeout(60)
TINY = preset_path("tiny")


@pytest.mark.parametrize("override", [
    "sft.lr=3e-4", "data.synthetic.num_sft=100", "seed=7", "rl.rollout.temperature=0.7",
    "reward.func_path=rewards/arithmetic.py",  # what the tiny preset itself says
    "inputs.sft_model=runs:/0123456789abcdef/sft_model", "inputs.reward_model=models:/rlhf-reward_model@champion",
])
def test_data_and_hyperparameters_pass(override):
    refuse_code_overrides("tiny", [override])


@pytest.mark.parametrize(("override", "key", "why"), [
    ("model.trust_remote_code=true", "model.trust_remote_code", "runs the model repository's own Python"),
    ("reward.func_path=/tmp/x.py", "reward.func_path", "names the Python file the reward workers run"),
    ("rl.agent.path=agents/chained_arithmetic.py", "rl.agent.path", "names the Python file the reward workers or the driver run"),
    ("rl.rollout.vllm_python=/bin/sh", "rl.rollout.vllm_python", "names the program the rollout engines run"),
    ("rl={agent: {path: x.py}}", "rl.agent.path", "names the Python file the reward workers or the driver run"),  # a whole section
    ("inputs.sft_model=someone/model", "inputs.sft_model", "downloads a model from the hub"),
])
def test_a_key_that_runs_or_chooses_code_is_one_line_naming_it(override, key, why):
    with pytest.raises(ConfigError) as err:
        refuse_code_overrides("tiny", ["sft.lr=1e-3", override])
    assert str(err.value) == (f"override {override!r}: {key} {why}; a deployment run takes data and hyperparameter "
                              f"overrides only: set {key} in the config file on the worker ({TINY})")


def test_what_the_config_file_on_the_worker_sets_may_be_repeated(tmp_path):
    own = tmp_path / "own.yaml"
    own.write_text("base: tiny\nrl:\n  agent:\n    path: agents/chained_arithmetic.py\n")
    refuse_code_overrides(str(own), ["rl.agent.path=agents/chained_arithmetic.py"])
    with pytest.raises(ConfigError, match=r"^override 'rl.agent.path=other.py': rl.agent.path names"):
        refuse_code_overrides(str(own), ["rl.agent.path=other.py"])


def test_a_deployment_run_keeps_the_config_its_deployment_was_registered_with():
    refuse_other_config("tiny", "tiny")
    with pytest.raises(ConfigError) as err:
        refuse_other_config("/home/someone/else.yaml", "tiny")
    assert str(err.value) == ("config='/home/someone/else.yaml': a deployment run takes the config file its deployment "
                              "was registered with ('tiny'); to run another, serve a deployment for it "
                              "(rlhf serve --config FILE)")
