"""Multi-turn environments for RL (OpenRLHF's agent API, in this project's shape).

`rl.agent.path` names a Python file defining `class Environment`, one instance per episode:

    reset(prompt, label) -> str
        the first observation: the text the policy continues first (usually the prompt as it is: the
        prompts are chat-formatted already)
    step(observation, action) -> (reward, next_observation, done)
        `observation` is what the policy last saw, `action` the text it answered; `reward` scores this
        turn; `next_observation` is appended to the context as it is (chat markers included: the
        environment writes the turn as the policy's template does) and is masked out of the loss

Either may be `async def`; a turn's steps then run concurrently. An episode ends when `done` is true or
after `rl.agent.max_turns` turns. The reward workers hold the episodes (their share of a rollout each),
so a step that never returns ends the stage after `rl.agent.timeout_s` and its workers are killed, as a
`reward_func` that never returns does. OpenRLHF's agent files are played here too
(stages/openrlhf_compat/agent.py); an executor with its own `execute` runs in the driver instead
(stages/rl/executor_run.py)."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from configs.errors import RewardError, first_line
from stages.openrlhf_compat.agent import InstanceEnvironment, MultiTurnAgentExecutor
from stages.rewards.func_scorer import load_module
from stages.rl.agent_file import CLASS, EXECUTOR, resolve
from stages.rl.turn_params import TurnParams, read_turn_params

__all__ = ["Episodes", "own_executor", "resolve", "turn_result"]


def own_executor(module: Any) -> type | None:
    """The file's `AgentExecutor` class where it plays episodes with its own `execute`, else None (an
    `Environment` file, or a `MultiTurnAgentExecutor` as it is: this project's or, where OpenRLHF is
    installed, OpenRLHF's, whose turns the RL loop plays)."""
    executor = getattr(module, EXECUTOR, None)
    if getattr(module, CLASS, None) is not None or not isinstance(executor, type):
        return None
    owner = next((c for c in executor.__mro__ if "execute" in vars(c)), None)
    return None if owner is None or owner.__name__ == MultiTurnAgentExecutor.__name__ else executor

def turn_result(value, where: str) -> tuple[float, str, bool]:
    """A `step` result as (reward, next observation, done), or one line saying what was wrong with it."""
    shape = "(reward: float, next_observation: str, done: bool)"
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        shown = (repr(value).strip().splitlines() or [""])[0][:80]
        raise RewardError(f"{where} returned {type(value).__name__} {shown}; it must return {shape}")
    reward, observation, done = value
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise RewardError(f"{where} returned reward {reward!r}; it must be a finite number: {shape}")
    if not isinstance(observation, str):
        raise RewardError(f"{where} returned next_observation of type {type(observation).__name__}; it must be a str: {shape}")
    if not isinstance(done, bool):
        raise RewardError(f"{where} returned done {done!r}; it must be True or False: {shape}")
    return float(reward), observation, done


class Episodes:
    """One reward worker's share of a rollout's episodes: an `Environment` each (for an OpenRLHF agent file,
    an `InstanceEnvironment` over an instance of its `AgentExecutor`'s class)."""

    def __init__(self, path: str | Path, module: Any = None):
        self.path = Path(path)
        module = module or load_module(self.path)
        cls = getattr(module, CLASS, None)
        executor = getattr(module, EXECUTOR, None)
        self.new_env: Callable[[], Any]
        if isinstance(cls, type):
            self.new_env, self.name = cls, CLASS
        elif own_executor(module) is not None:
            raise RewardError(f"rl.agent.path={self.path}: its {EXECUTOR} has its own execute(); the driver runs its "
                              "episodes, not the reward workers")
        elif isinstance(executor, type):
            try:
                instance_cls = executor().agent_instance_cls
            except Exception as exc:
                raise RewardError(f"{EXECUTOR}() in {self.path} raised {type(exc).__name__}: {first_line(exc)}") from exc
            where = f"AgentInstance.step in {self.path}"
            self.new_env, self.name = (lambda: InstanceEnvironment(instance_cls, where)), "AgentInstance"
        else:
            raise RewardError(f"rl.agent.path={self.path}: defines no class {CLASS} (or OpenRLHF's {EXECUTOR})")
        self.envs: list = []
        self.loop = asyncio.new_event_loop()  # one for every call: what an instance binds to it stays usable

    def _run(self, calls: list, what: str) -> list:
        """Each call's result; the coroutines among them awaited together."""
        results = []
        for call in calls:
            try:
                results.append(call())
            except RewardError:  # already one line naming the file
                raise
            except Exception as exc:
                raise RewardError(f"{self.where(what)} raised {type(exc).__name__}: {first_line(exc)}") from exc
        pending = [i for i, r in enumerate(results) if inspect.isawaitable(r)]
        if pending:
            async def gather():
                return await asyncio.gather(*(results[i] for i in pending), return_exceptions=True)

            for i, value in zip(pending, self.loop.run_until_complete(gather())):
                if isinstance(value, RewardError):
                    raise value
                if isinstance(value, Exception):
                    raise RewardError(f"{self.where(what)} raised {type(value).__name__}: {first_line(value)}") from value
                results[i] = value
        return results

    def where(self, what: str) -> str:
        return f"{self.name}.{what} in {self.path}"

    def reset(self, prompts: list[str], labels: list[str | None]) -> list[str]:
        """New episodes, one per prompt (the previous rollout's are dropped); their first observations."""
        try:
            self.envs = [self.new_env() for _ in prompts]
        except Exception as exc:
            raise RewardError(f"{self.name}() in {self.path} raised {type(exc).__name__}: {first_line(exc)}") from exc
        first = self._run([lambda env=env, p=p, y=y: env.reset(p, y) for env, p, y in zip(self.envs, prompts, labels)], "reset")
        for value in first:
            if not isinstance(value, str):
                raise RewardError(f"{self.where('reset')} returned {type(value).__name__}; it must return the first "
                                  "observation as a str")
        return first

    def step(self, episodes: list[int], observations: list[str], actions: list[str],
             params: list[TurnParams]) -> list[tuple[float, str, bool, TurnParams]]:
        """One turn of the given episodes (indices into this worker's share), each sampled with `params`; with
        each result, the episode's settings for its next turn (an OpenRLHF instance may change them)."""
        where = self.where("step")
        results = self._run([lambda env=self.envs[i], o=o, a=a, p=p:
                             env.step(o, a, p.as_sampling_params()) if isinstance(env, InstanceEnvironment) else env.step(o, a)
                             for i, o, a, p in zip(episodes, observations, actions, params)], "step")
        out = []
        for i, result, current in zip(episodes, results, params):
            given = None
            if isinstance(self.envs[i], InstanceEnvironment):  # checked there; with its next turn's settings
                *result, given = result
            out.append((*turn_result(result, where), read_turn_params(given, current, where)))
        return out

    def outcomes(self) -> list[tuple[float | None, dict[str, float]]]:
        """Each episode's score and logs, where its environment gives them (an OpenRLHF agent's last `scores`
        and `extra_logs`); (None, {}) for an `Environment`, whose episodes are scored by their return."""
        return [(env.score, env.logs) if isinstance(env, InstanceEnvironment) else (None, {}) for env in self.envs]
