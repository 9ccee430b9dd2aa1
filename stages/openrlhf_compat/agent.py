"""OpenRLHF's agent API (`openrlhf.utils.agent`) as this project runs it. An agent file defines `AgentExecutor`:

- a `MultiTurnAgentExecutor` over its `AgentInstanceBase` subclass, whose instances play one episode each
  through async `reset(states)` and `step(states)` (`__init__` may be `async def`, as OpenRLHF's README writes
  it). `InstanceEnvironment` turns one such instance into this project's `Environment` (stages/rl/agent.py), so
  the RL stage's multi-turn loop plays it, turn by turn for all episodes at once;
- or any `AgentExecutorBase` subclass with its own `execute(prompt, label, sampling_params, max_length,
  hf_tokenizer, llm_engine)`: it owns the episode at the token level, and the RL stage's driver runs the
  episodes concurrently against an engine that batches their requests (stages/rl/executor_run.py).

What `step` receives, as in OpenRLHF: `observation_text` (the episode so far: the first observation and every
earlier action and feedback), `action_text` (the policy's answer), `label`, `sampling_params` (this turn's:
temperature, top_p, max_tokens, stop). What it returns: `rewards` (this turn's; an episode's reward is their
sum, as OpenRLHF's), `environment_feedback` (appended to the context, masked out of the loss), `done`, and
optionally `scores`, `extra_logs` and `sampling_params` for the next turn (every engine honours its
temperature, top_p, max_tokens and stop; max_tokens is capped at the rollout's budget per turn). As in
OpenRLHF's executor, an episode's score is its last step's `scores` (else its return; dynamic filtering reads
it) and its logs are its last step's `extra_logs`."""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from typing import Any

from configs.errors import RewardError
from stages.openrlhf_compat.sampling import SamplingParams
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


class AgentExecutorBase(ABC):
    """Owns an episode: `execute` plays it against `llm_engine` (whose `generate(prompt_token_ids,
    sampling_params)` returns vLLM's `RequestOutput` shape) and returns OpenRLHF's result dict:
    `observation_tokens`, `action_ranges` (the policy's tokens among them), `rollout_log_probs`, `reward`,
    and optionally `scores` and `extra_logs`."""

    @abstractmethod
    async def execute(self, prompt: str, label: str | None, sampling_params: Any, max_length: int,
                      hf_tokenizer: Any, llm_engine: Any) -> dict:
        raise NotImplementedError


async def new_instance(cls: type) -> Any:
    """An instance of an agent's class, whose `__init__` may be `async def` (as OpenRLHF's README writes it)."""
    init = inspect.getattr_static(cls, "__init__")
    if inspect.iscoroutinefunction(init):
        instance: Any = object.__new__(cls)
        await init(instance)
        return instance
    return cls()


class MultiTurnAgentExecutor(AgentExecutorBase):
    """Holds the instance class. Used as it is, this project's RL loop plays the turns of all episodes at once
    (stages/rl/episodes.py); `execute` plays one episode through an engine, for a subclass that builds on it."""

    def __init__(self, agent_instance_cls: type) -> None:
        self.agent_instance_cls = agent_instance_cls

    async def execute(self, prompt: str, label: str | None, sampling_params: Any, max_length: int,
                      hf_tokenizer: Any, llm_engine: Any) -> dict:
        """OpenRLHF's loop: generate, step, append the feedback, until done or out of `max_length`; each step's
        result checked as the RL loop checks it (`InstanceEnvironment`)."""
        from stages.rl.turn_params import TurnParams, read_turn_params

        where = "AgentInstance.step in the agent file"
        env = InstanceEnvironment(self.agent_instance_cls, where)
        observation = await env.reset(prompt, label)
        tokens = list(hf_tokenizer(observation, add_special_tokens=False)["input_ids"])
        log_probs = [0.0] * len(tokens)
        action_ranges: list[tuple[int, int]] = []
        total = 0.0
        current = read_turn_params(sampling_params, TurnParams(None, 1.0, max_length), where)
        while (budget := max_length - len(tokens)) > 0:
            turn = current.capped(budget).as_sampling_params()
            out = (await llm_engine.generate(tokens, turn)).outputs[0]
            action = list(out.token_ids)
            action_ranges.append((len(tokens), len(tokens) + len(action)))
            log_probs += [step[t].logprob for t, step in zip(action, out.logprobs)]
            reward, feedback, done, given = await env.step(observation, out.text, turn)
            total += reward
            fed = list(hf_tokenizer(feedback, add_special_tokens=False)["input_ids"])
            observation += out.text + feedback
            tokens += action + fed
            log_probs += [0.0] * len(fed)
            current = read_turn_params(given, current, where)
            if done:
                break
        return {"prompt": prompt, "label": label, "observation_tokens": tokens, "action_ranges": action_ranges,
                "rollout_log_probs": log_probs, "reward": total, "scores": total if env.score is None else env.score,
                "extra_logs": env.logs}


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
    """An instance of an `AgentInstanceBase` class in the shape of this project's `Environment` (made at
    `reset`, so that an `async def __init__` is awaited); `step` also gives the next turn's `sampling_params`,
    if the instance set them."""

    def __init__(self, instance_cls: type, where: str) -> None:
        self.instance_cls, self.where = instance_cls, where
        self.instance: Any = None
        self.text: str = ""
        self.label: str | None = None
        self.score: float | None = None  # the last step's `scores`
        self.logs: dict[str, float] = {}  # the last step's `extra_logs`, each a float

    async def reset(self, prompt: str, label: str | None) -> str:
        self.instance = await new_instance(self.instance_cls)
        result = await self.instance.reset({"observation": prompt, "label": label})
        if not isinstance(result, dict) or not isinstance(result.get("observation"), str):
            raise RewardError(f"{self.where.replace('step', 'reset')} returned {type(result).__name__}; it must "
                              "return a dict with the first 'observation' as a str")
        self.text, self.label = result["observation"], label
        return result["observation"]

    async def step(self, observation: str, action: str,
                   sampling_params: SamplingParams | None = None) -> tuple[float, str, bool, Any]:
        states = {"observation_text": self.text, "action_text": action, "label": self.label,
                  "sampling_params": sampling_params}
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
        return reward, feedback, done, result.get("sampling_params")
