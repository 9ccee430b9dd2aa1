"""A multi-turn agent through the RL stage's own loop (in one process, no Ray): every episode takes its
environment's two turns in the rollouts and in the held-out evals, its turn rewards reach the
token-level estimator, and the policy trains on its answers only. (The turns and the loss mask token
by token: tests/unit/test_agent.py; what RL makes of the shipped example: docs/benchmarks.md.)"""

from pathlib import Path

import pytest
from safetensors.torch import load_file

from configs import load_config
from stages.rl import stage as rl_stage
from tests.stage.conftest import FAST, make_ctx

pytestmark = pytest.mark.slow  # trains the policy

TWO_TURNS = """
class Environment:
    def reset(self, prompt, label):
        self.turn = 0
        return prompt

    async def step(self, observation, action):
        self.turn += 1
        return (0.5, "<|user|>\\nCompute 1+1\\n<|assistant|>\\n", False) if self.turn == 1 else (1.0, "", True)
"""


def test_every_episode_takes_its_two_turns_and_their_rewards_reach_the_estimator(prepared, tmp_path):
    env = tmp_path / "two_turns.py"
    env.write_text(TWO_TURNS)
    cfg = load_config(None, [*FAST, f"rl.agent.path={env}", "rl.algorithm.advantage_estimator=reinforce", "rl.max_steps=2",
                             "rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=2", "rl.train_batch_size=8",
                             "rl.micro_train_batch_size=8", "rl.rollout.generate_max_len=8", "rl.eval_every=2",
                             "eval.max_samples=4", "eval.max_new_tokens=8", "eval.samples_per_prompt=2",
                             "rl.actor.lr=1e-3"])
    logged = []
    ctx = make_ctx("rl", cfg, tmp_path, lambda metrics, step: logged.append((step, metrics)))
    inputs = {"sft_model": prepared["base_model"], "prompts": prepared["prompts"], "eval_data": prepared["eval_data"]}
    result = rl_stage.run_in_process(ctx, inputs)
    steps = [m for _, m in logged if "train/reward" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["rollout/turns"] == 2.0 and m["train/reward"] == pytest.approx(1.5)  # the return: 0.5 + 1.0
    evals = [m for s, m in logged if "eval/turns" in m]
    assert [m["eval/turns"] for m in evals] == [2.0, 2.0]  # before RL and after step 2
    assert all(m["eval/reward"] == pytest.approx(1.5) and m["eval/sampled_reward"] == pytest.approx(1.5) for m in evals)
    before = load_file(prepared["base_model"] / "model.safetensors")
    after = load_file(result.outputs["rl_model"] / "model.safetensors")
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-5


@pytest.mark.parametrize("agent", [str(Path(__file__).parent.parent / "data" / "openrlhf_examples" / "readme_agent_func.py"),
                                   "agents/chained_arithmetic_openai.py"])
def test_openrlhfs_readme_agent_and_an_openai_client_agent_train_unchanged(prepared, tmp_path, agent):
    """The README's multi-turn example (its `async def __init__`) and an executor behind the OpenAI-compatible
    server, each as its file is, through the stage: episodes of their turns in rollouts and evals, trained on.
    (That RL raises the held-out reward of the chained-arithmetic agent over its SFT start is a benchmark's:
    docs/benchmarks.md#multi-turn-agent.)"""
    cfg = load_config(None, [*FAST, f"rl.agent.path={agent}", "rl.algorithm.advantage_estimator=group_norm", "rl.max_steps=2",
                             "rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=2", "rl.train_batch_size=8",
                             "rl.micro_train_batch_size=8", "rl.rollout.generate_max_len=8", "rl.eval_every=2",
                             "rl.agent.max_turns=4", "eval.max_samples=4", "eval.max_new_tokens=8",
                             "eval.samples_per_prompt=1", "rl.actor.lr=1e-3"])
    logged = []
    ctx = make_ctx("rl", cfg, tmp_path, lambda metrics, step: logged.append((step, metrics)))
    inputs = {"sft_model": prepared["base_model"], "prompts": prepared["prompts"], "eval_data": prepared["eval_data"]}
    result = rl_stage.run_in_process(ctx, inputs)
    steps = [m for _, m in logged if "train/reward" in m]
    assert len(steps) == 2 and all(1.0 <= m["rollout/turns"] <= 4.0 for m in steps)
    assert [m["eval/turns"] >= 1.0 for _, m in logged if "eval/turns" in m] == [True, True]
    before = load_file(prepared["base_model"] / "model.safetensors")
    after = load_file(result.outputs["rl_model"] / "model.safetensors")
    moved = max((after[k] - before[k]).abs().max().item() for k in before) > 1e-5
    # the weights move exactly when some group's episodes differed in reward (the stand-in model seldom answers
    # the arithmetic: the README agent's coin-flip rewards differ, the OpenAI agent's may all be 0)
    assert moved == any(m["rollout/reward_std"] > 0 for m in steps)
