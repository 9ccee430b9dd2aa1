"""Multi-turn episodes (`rl.agent.path`): the turns, the loss mask over the environment's tokens, where
each turn's reward goes, and one line for each way an environment file can be wrong. The engine here
answers from a script (the sampling itself is the engines' tests); the environment is the shipped example."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from configs import load_config
from configs.errors import RewardError
from stages.dag.contract import NodeInputs
from stages.rl import agent_file
from stages.rl.episodes import Hosts, run_episodes
from stages.rl.experience import place_on_actions, sequence_batch
from stages.rl.reward_worker import RewardWorker
from stages.rl.turn_params import TurnParams
from tests.unit.agent_helpers import PROMPT, Actors, ScriptedEngine

EXAMPLE = "agents/chained_arithmetic.py"


def config(*overrides: str, path: str = EXAMPLE):
    return load_config(None, [f"rl.agent.path={path}", *overrides])


def test_two_turns_mask_the_environments_tokens_and_reward_the_answers_ends(tokenizer):
    cfg = config()
    engine = ScriptedEngine(tokenizer, ["7+14=21\nAnswer: 21", "21-9=12\nAnswer: 12"])
    (sample,), scored = run_episodes(Actors(cfg, engine), tokenizer, [PROMPT], ["12"], cfg, seed=0,
                                     temperature=1.0, max_new_tokens=20)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    first = [*encode("7+14=21\nAnswer: 21"), tokenizer.eos_token_id]
    # the environment's turn, with the chat markers: the whole problem, and the answer begun with the policy's first step
    between = encode("\n<|user|>\nCompute 7+14-9\n<|assistant|>\n7+14=21\n")
    second = [*encode("21-9=12\nAnswer: 12"), tokenizer.eos_token_id]
    assert sample.prompt_ids == encode("<|user|>\nCompute 7+14\n<|assistant|>\n")  # the held-back operand is not shown
    assert sample.response_ids == first + between + second
    assert engine.contexts[1] == [sample.prompt_ids + first + between]  # turn 2 answers the whole conversation
    assert sample.trained == [1] * len(first) + [0] * len(between) + [1] * len(second)
    assert sample.log_probs == [-0.5] * len(first) + [0.0] * len(between) + [-0.5] * len(second)
    assert sample.turn_ends == [len(first) - 1, len(sample.response_ids) - 1]
    assert scored.step_rewards == [[0.0, 1.0]] and scored.rewards.tolist() == [1.0]

    # the loss mask: the policy's tokens only (position t predicts token t+1)
    batch = sequence_batch([sample], pad_id=tokenizer.pad_token_id)
    p = len(sample.prompt_ids)
    expected = torch.zeros(p + len(sample.response_ids) - 1)
    expected[p - 1 :] = torch.tensor(sample.trained, dtype=torch.float32)
    assert torch.equal(batch["action_mask"][0], expected)
    assert float((batch["rollout_log_probs"][0] * (1 - expected)).abs().sum()) == 0.0
    # each turn's reward on its answer's last token (the token-level estimators' dense rewards)
    dense = place_on_actions(scored.step_rewards, [sample.turn_ends], [sample], batch["action_mask"].shape[1])
    assert dense[0].nonzero().flatten().tolist() == [p - 1 + len(sample.response_ids) - 1]
    assert dense[0, p - 1 + len(first) - 1] == 0.0 and dense[0, -1] == 1.0


def test_a_wrong_first_answer_fails_the_chain_and_a_missing_answer_ends_the_episode(tokenizer):
    cfg = config()
    wrong = ScriptedEngine(tokenizer, ["Answer: 20", "20-9=11\nAnswer: 11"])
    (sample,), scored = run_episodes(Actors(cfg, wrong), tokenizer, [PROMPT], ["12"], cfg, 0, 1.0, 20)
    assert scored.step_rewards == [[0.0, 0.0]] and len(sample.turn_ends) == 2
    silent = ScriptedEngine(tokenizer, ["7+14=21"])
    (sample,), scored = run_episodes(Actors(cfg, silent), tokenizer, [PROMPT], ["12"], cfg, 0, 1.0, 20)
    assert scored.step_rewards == [[0.0]] and sample.trained == [1] * len(sample.response_ids)


def test_max_turns_ends_an_episode_its_environment_keeps_open(tokenizer, tmp_path):
    endless = tmp_path / "endless.py"
    endless.write_text(textwrap.dedent("""
        class Environment:
            def reset(self, prompt, label):
                return prompt
            async def step(self, observation, action):  # async steps run concurrently
                return 0.5, "\\n", False
    """))
    cfg = config("rl.agent.max_turns=3", path=str(endless))
    engine = ScriptedEngine(tokenizer, ["1", "2", "3", "4"])
    samples, scored = run_episodes(Actors(cfg, engine), tokenizer, [PROMPT, PROMPT], ["1", "2"], cfg, 0, 1.0, 5)
    assert len(engine.contexts) == 3 and scored.rewards.tolist() == [1.5, 1.5]
    assert all(len(s.turn_ends) == 3 for s in samples)


BAD_ENVIRONMENTS = {
    "raises": ("def step(self, observation, action):\n        raise KeyError('tool')",
               r"^Environment.step in .*bad.py raised KeyError: 'tool'$"),
    "malformed": ("def step(self, observation, action):\n        return 1.0",
                  r"^Environment.step in .*bad.py returned float 1.0; it must return \(reward: float, next_observation: str, done: bool\)$"),
    "bad done": ("def step(self, observation, action):\n        return 1.0, '', 'yes'",
                 r"^Environment.step in .*bad.py returned done 'yes'; it must be True or False"),
    "nan reward": ("def step(self, observation, action):\n        return float('nan'), '', True",
                   r"^Environment.step in .*bad.py returned reward nan; it must be a finite number"),
}


@pytest.mark.parametrize("case", BAD_ENVIRONMENTS)
def test_an_environment_that_misbehaves_is_one_line_naming_it(tokenizer, tmp_path, case):
    body, message = BAD_ENVIRONMENTS[case]
    bad = tmp_path / "bad.py"
    bad.write_text(f"class Environment:\n    def reset(self, prompt, label):\n        return prompt\n    {body}\n")
    cfg = config(path=str(bad))
    with pytest.raises(RewardError, match=message):
        run_episodes(Actors(cfg, ScriptedEngine(tokenizer, ["Answer: 1"])), tokenizer, [PROMPT], ["1"], cfg, 0, 1.0, 5)


def test_a_step_that_never_returns_ends_at_the_timeout(tokenizer, tmp_path):
    stuck = tmp_path / "stuck.py"
    stuck.write_text("import threading\nclass Environment:\n    def reset(self, prompt, label):\n        return prompt\n"
                     "    def step(self, observation, action):\n        threading.Event().wait(20)\n")
    cfg = config("rl.agent.timeout_s=0.5", path=str(stuck))
    with pytest.raises(RewardError, match=rf"^rl.agent.path={stuck}: Environment.step did not return within "
                                          r"rl.agent.timeout_s=0.5 s; fix the environment or raise rl.agent.timeout_s$"):
        run_episodes(Actors(cfg, ScriptedEngine(tokenizer, ["Answer: 1"])), tokenizer, [PROMPT], ["1"], cfg, 0, 1.0, 5)


def test_episodes_are_shared_over_the_reward_workers_in_order(tokenizer):
    cfg = config()
    actors = Actors(cfg, None)
    second = RewardWorker(1)
    second.setup(cfg, NodeInputs({}), [], ".")
    actors.reward.append(second)
    hosts = Hosts(actors, 3, cfg)
    prompts = [PROMPT, PROMPT.replace("7+14-9", "3+4"), PROMPT.replace("7+14-9", "5-2+1")]
    first = hosts.call(lambda w: w.agent_reset, [0, 1, 2], prompts, ["12", "7", "4"], indexed=False)
    assert ["Compute 7+14\n" in first[0], "Compute 3+4\n" in first[1], "Compute 5-2\n" in first[2]] == [True] * 3
    assert [len(w.episodes.envs) for w in actors.reward] == [2, 1]
    # episode 2 lives on the second worker as its episode 0
    params = TurnParams(1.0, 1.0, 5)
    (reward, observation, done, following), = hosts.call(lambda w: w.agent_step, [2], [first[2]], ["Answer: 3"], [params])
    assert (reward, done) == (0.0, False) and observation.endswith("Compute 5-2+1\n<|assistant|>\n5-2=3\n")
    assert following == params  # an Environment keeps the rollout's settings


@pytest.mark.parametrize(("source", "message"), [
    ("x = 1\n", "defines no class Environment; define one with reset(prompt, label) and step(observation, action)"),
    ("class Environment:\n    def reset(self, prompt, label):\n        return prompt\n", "class Environment has no step"),
    ("class Environment(\n", "line 1: SyntaxError"),
])
def test_an_agent_file_is_checked_before_anything_runs(tmp_path, source, message):
    path = tmp_path / "env.py"
    path.write_text(source)
    with pytest.raises(RewardError, match=f"^rl.agent.path={re.escape(str(path))}: {re.escape(message)}"):
        agent_file.check(path)
    with pytest.raises(RewardError, match=r"^rl.agent.path=missing.py: no such file$"):
        agent_file.resolve("missing.py")
    agent_file.check(agent_file.resolve(EXAMPLE))


def test_async_training_and_an_agent_go_together():
    cfg = config("rl.rollout.async_train=true", "rl.rollout.async_queue_size=2")
    assert cfg.rl.agent.path == EXAMPLE and cfg.rl.rollout.async_queue_size == 2
