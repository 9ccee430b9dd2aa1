"""OpenRLHF's own reward and agent files load and run here unchanged, whether or not OpenRLHF is installed:
`reward_func.py` (random 0/1 rewards as a dict), `math_reward_func.py` (`\\boxed{}` answers graded with
`openrlhf.utils`), `agent_func.py` (an `AgentInstanceBase` of 1-3 steps behind a `MultiTurnAgentExecutor`).
The math helpers' expected values are worked out by hand."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from configs import load_config
from configs.errors import RewardError
from stages.openrlhf_compat.answers import extract_boxed_answer, grade_answer
from stages.rewards.func_scorer import FunctionScorer
from stages.rl.agent import Episodes
from stages.rl.episodes import run_episodes
from tests.unit.agent_helpers import PROMPT, Actors, ScriptedEngine

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).parent.parent / "data" / "openrlhf_examples"


@pytest.mark.parametrize(("text", "expected"), [
    ("so \\boxed{42}.", "42"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last box, nested braces whole
    ("\\fbox{x+1}", "x+1"),
    ("no box here", None),
    ("\\boxed{unclosed", None),
])
def test_extract_boxed_answer(text, expected):
    assert extract_boxed_answer(text) == expected


@pytest.mark.parametrize(("given", "truth", "same"), [
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{3}{4}", "3/4", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("1,000", "1000", True),
    ("\\text{5}.", "5", True),
    ("$x + 1$", "x+1", True),
    ("3", "4", False),
    ("1/0", "1", False),
    (None, "1", False),
])
def test_grade_answer(given, truth, same):
    assert grade_answer(given, truth) is same


@pytest.mark.timeout(10)  # built as an exact integer, 1e999999999 alone takes minutes and gigabytes
@pytest.mark.parametrize(("given", "truth", "same"), [
    ("1e3", "1000", True),  # exponents are exact: 1 x 10^3
    ("2.5e-3", "\\frac{1}{400}", True),  # 0.0025 = 1/400
    ("1e999999999", "1", False),  # a billion-digit number is compared as text: not 1
    ("1e999999999", "1e999999999", True),  # the same text
    ("1e-999999999", "0", False),  # and not rounded to 0 either
    ("1e999999999/1e999999999", "1", False),
    ("\\frac{1}{3}", "1" * 10_000 + "/3", False),  # 10,000 digits: over the 1,000-digit bound, text only
    ("1" * 999 + "/1", "1" * 999, True),  # 999 digits: still a number
    ("1/2/3", "1.5", True),  # read as 1 / (2/3), as Fraction reads a denominator
    ("1_000", "1000", True),  # Fraction's digit separators
    ("1e1_000", "10e999", True),  # a power of ten of 1,000: built, the same number
    ("1e1_001", "10e1000", False),  # 1,001: over the bound, compared as text
    ("Infinity", "1", False),
    ("NaN", "NaN", True),  # the same text, not a number
])
def test_grade_answer_of_huge_numbers_ends_at_once(given, truth, same):
    assert grade_answer(given, truth) is same


def test_openrlhf_reward_func_returns_rewards_scores_and_extra_logs():
    batch = FunctionScorer(EXAMPLES / "reward_func.py").score(["p"] * 6, ["r"] * 6, ["1"] * 6)
    assert set(batch.rewards.tolist()) <= {0.0, 1.0} and batch.rewards.shape == (6,)
    assert batch.scores is not None and torch.equal(batch.scores, batch.rewards)  # the file gives both: the same
    assert set(batch.extra_logs) == {"dummy_scores"}
    assert batch.extra_logs["dummy_scores"] == pytest.approx(float(batch.rewards.mean()))


def test_openrlhf_math_reward_func_grades_boxed_answers_without_openrlhf_installed():
    assert "openrlhf" not in sys.modules or getattr(sys.modules["openrlhf"], "__file__", None) is None
    responses = ["so \\boxed{\\frac{1}{2}}", "\\boxed{7}", "no box", "\\boxed{1,000}"]
    batch = FunctionScorer(EXAMPLES / "math_reward_func.py").score(["Q: "] * 4, responses, ["0.5", "8", "3", "1000"])
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert batch.scores is not None and batch.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert batch.extra_logs == {"math_accuracy": 0.5}


def test_openrlhf_agent_func_plays_episodes_of_several_turns(tokenizer):
    cfg = load_config(None, [f"rl.agent.path={EXAMPLES / 'agent_func.py'}", "rl.agent.max_turns=5"])
    engine = ScriptedEngine(tokenizer, ["1", "2", "3", "4", "5"])
    samples, scored = run_episodes(Actors(cfg, engine), tokenizer, [PROMPT] * 4, ["1"] * 4, cfg, 0, 1.0, 5)
    # each instance ends after its random 1-3 steps, on the step after them: 2 to 4 turns
    assert all(2 <= len(s.turn_ends) <= 4 for s in samples), [len(s.turn_ends) for s in samples]
    assert len(engine.contexts) == max(len(s.turn_ends) for s in samples)
    # only the last turn is rewarded, 0 or 1; the feedback between answers is not trained on
    assert all(steps[:-1] == [0.0] * (len(steps) - 1) and steps[-1] in (0.0, 1.0) for steps in scored.step_rewards)
    assert all(0 in s.trained for s in samples)
    # the feedback of a turn that is not the last goes into the context whole, untrained, as OpenRLHF appends it
    feedback = "\n\nHuman: [INCORRECT]\nPlease analyze the issues and try again.\n</s>\n\nAssistant: "
    k = len(tokenizer(feedback, add_special_tokens=False)["input_ids"])
    answer = len(tokenizer("1", add_special_tokens=False)["input_ids"]) + 1  # with its end token
    for s in samples:
        assert s.trained[answer : answer + k + 1] == [0] * k + [1]


SHAPED_AGENT = """
import torch
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        self.turn = 0

    async def reset(self, states, **kwargs):
        self.correct = states["label"] == "1"
        return {"observation": states["observation"]}

    async def step(self, states, **kwargs):
        self.turn += 1
        done = self.turn == 2
        out = {"rewards": torch.tensor(0.25), "environment_feedback": "" if done else " again: ", "done": done,
               "extra_logs": {"turn": torch.tensor([float(self.turn)] * 3)}}
        if done and self.correct:
            out["scores"] = 1.0  # a score apart from the shaped reward, on the last turn only
        return out


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self):
        super().__init__(AgentInstance)
"""


def test_an_agents_scores_and_extra_logs_are_its_last_steps(tmp_path, tokenizer):
    """OpenRLHF's executor keeps the last step's `scores` (else the episode's summed reward) for dynamic
    filtering, and the last step's `extra_logs` for the log; here they reach the rollout's reward batch."""
    path = tmp_path / "agent_func.py"
    path.write_text(SHAPED_AGENT)
    cfg = load_config(None, [f"rl.agent.path={path}", "rl.agent.max_turns=4"])
    _, scored = run_episodes(Actors(cfg, ScriptedEngine(tokenizer, ["1"] * 4)), tokenizer, [PROMPT] * 3, ["1", "2", "1"],
                             cfg, 0, 1.0, 5)
    assert scored.rewards.tolist() == [0.5, 0.5, 0.5]  # two turns of 0.25 each
    assert scored.scores is not None and scored.scores.tolist() == [1.0, 0.5, 1.0]  # no score: the return
    assert scored.filter_values().tolist() == [1.0, 0.5, 1.0]
    assert scored.extra_logs == {"turn": 2.0}  # the last step's, not the mean over the turns (1.5)


def test_the_example_agents_scores_are_its_last_reward(tokenizer):
    cfg = load_config(None, [f"rl.agent.path={EXAMPLES / 'agent_func.py'}", "rl.agent.max_turns=5"])
    _, scored = run_episodes(Actors(cfg, ScriptedEngine(tokenizer, ["1"] * 5)), tokenizer, [PROMPT] * 4, ["1"] * 4, cfg, 0, 1.0, 5)
    last = torch.tensor([steps[-1] for steps in scored.step_rewards])
    assert scored.scores is not None and torch.equal(scored.scores, last)
    assert scored.extra_logs == {"dummy_scores": pytest.approx(float(last.mean()))}


def test_an_agent_step_without_rewards_is_one_line_naming_the_file(tmp_path, tokenizer):
    bad = tmp_path / "agent_func.py"
    bad.write_text((EXAMPLES / "agent_func.py").read_text().replace('"rewards": reward,', ""))
    cfg = load_config(None, [f"rl.agent.path={bad}"])
    with pytest.raises(RewardError, match=rf"^AgentInstance.step in {bad} returned a dict without 'rewards' \(keys: "
                                          r"\['done', 'environment_feedback', 'extra_logs', 'sampling_params', 'scores'\]\); "
                                          "it must return a dict with rewards, environment_feedback and done$"):
        run_episodes(Actors(cfg, ScriptedEngine(tokenizer, ["1"] * 5)), tokenizer, [PROMPT], ["1"], cfg, 0, 1.0, 5)


def test_with_openrlhf_installed_its_own_classes_are_used(monkeypatch):
    """A stand-in for the real package (its executor checks the instance class, as OpenRLHF's does)."""
    agent = types.ModuleType("openrlhf.utils.agent")

    class AgentInstanceBase:
        pass

    class MultiTurnAgentExecutor:
        def __init__(self, cls):
            assert issubclass(cls, AgentInstanceBase)
            self.agent_instance_cls = cls

    agent.AgentInstanceBase, agent.MultiTurnAgentExecutor = AgentInstanceBase, MultiTurnAgentExecutor
    utils = types.ModuleType("openrlhf.utils")
    utils.agent = agent
    root = types.ModuleType("openrlhf")
    root.utils = utils
    for name, module in (("openrlhf", root), ("openrlhf.utils", utils), ("openrlhf.utils.agent", agent)):
        monkeypatch.setitem(sys.modules, name, module)
    episodes = Episodes(EXAMPLES / "agent_func.py")
    assert episodes.reset(["hi"], ["1"]) == ["hi"]
    assert isinstance(episodes.envs[0].instance, AgentInstanceBase)
