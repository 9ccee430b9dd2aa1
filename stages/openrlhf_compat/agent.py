"""OpenRLHF's agent API (`openrlhf.utils.agent`) as this project runs it: an agent file defines
`AgentExecutor`, a `MultiTurnAgentExecutor` over its `AgentInstanceBase` subclass, whose instances play one
episode each through async `reset(states)` and `step(states)`. `InstanceEnvironment` turns one such instance
into this project's `Environment` (stages/rl/agent.py), so the RL stage's multi-turn loop plays it.

What `step` receives, as in OpenRLHF: `observation_text` (the episode so far: the first observation and every
earlier action and feedback), `action_text` (the policy's answer), `label`, `sampling_params` (None here:
sampling is set by `rl.rollout`). What it returns: `rewards` (this turn's; an episode's reward is their
sum, as OpenRLHF's), `environment_feedback` (appended to the context, masked out of the loss), `done`, and
optionally `scores` and `extra_logs`. As in OpenRLHF's executor, an episode's score is its last step's `scores`
(else its return; dynamic filtering reads it) and its logs are its last step's `extra_logs`."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

from configs.errors import RewardError
from stages.rewards.base import mean_logs


class AgentInstanceBase(ABC):
    """One episode's environment (OpenRLHF's base class)."""

    @abstractmethod
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        return states

    @abstractmethod
    async def step(self, states: dict, **kwargs: Any) -> dict:
        raise NotImplementedError


class MultiTurnAgentExecutor:
    """Holds the instance class; this project's RL loop plays the turns."""

    def __init__(self, agent_instance_cls: type) -> None:
        self.agent_instance_cls = agent_instance_cls


def as_float(value: Any, what: str, where: str) -> float:
    """A reward given as a number or a one-element tensor."""
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        raise RewardError(f"{where} returned {what} {value!r}; it must be a number or a one-element tensor") from None
    if not math.isfinite(number):
        raise RewardError(f"{where} returned {what} {number}; it must be finite")
    return number


class InstanceEnvironment:
    """An `AgentInstanceBase` instance in the shape of this project's `Environment`."""

    def __init__(self, instance: Any, where: str) -> None:
        self.instance, self.where = instance, where
        self.text: str = ""
        self.label: str | None = None
        self.score: float | None = None  # the last step's `scores`
        self.logs: dict[str, float] = {}  # the last step's `extra_logs`, each a float

    async def reset(self, prompt: str, label: str | None) -> str:
        result = await self.instance.reset({"observation": prompt, "label": label})
        if not isinstance(result, dict) or not isinstance(result.get("observation"), str):
            raise RewardError(f"{self.where.replace('step', 'reset')} returned {type(result).__name__}; it must "
                              "return a dict with the first 'observation' as a str")
        self.text, self.label = result["observation"], label
        return result["observation"]

    async def step(self, observation: str, action: str) -> tuple[float, str, bool]:
        states = {"observation_text": self.text, "action_text": action, "label": self.label, "sampling_params": None}
        result = await self.instance.step(states)
        if not isinstance(result, dict) or "rewards" not in result:
            got = f"a dict without 'rewards' (keys: {sorted(result)})" if isinstance(result, dict) else type(result).__name__
            raise RewardError(f"{self.where} returned {got}; it must return a dict with rewards, environment_feedback "
                              "and done")
        feedback = result.get("environment_feedback", "")
        if not isinstance(feedback, str):
            raise RewardError(f"{self.where} returned environment_feedback of type {type(feedback).__name__}; it must "
                              "be a str")
        reward = as_float(result["rewards"], "rewards", self.where)
        done = bool(result.get("done", False))
        if result.get("scores") is not None:
            self.score = as_float(result["scores"], "scores", self.where)
        if "extra_logs" in result:
            self.logs = mean_logs(result["extra_logs"], self.where)
        self.text += action + feedback
        return reward, feedback, done
