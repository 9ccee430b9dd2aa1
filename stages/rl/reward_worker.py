"""The RL stage's reward worker: the shared scorer (RM, PRM, rule function or remote server) behind one
actor, and with `rl.agent.path` its share of a rollout's multi-turn episodes (stages/rl/agent.py).

Apart from stages/rl/workers.py so that its process imports what its scorer needs and no more: a rule
function's or a remote server's worker starts without transformers and DeepSpeed (seconds of CPU less
per RL run); a reward model's scorer imports them when it is built."""

from __future__ import annotations

import os
import sys

from configs.schema import PipelineConfig
from stages.common import determinism, dist_env
from stages.dag.contract import NodeInputs
from stages.rewards.base import RewardSource
from stages.rewards.func_scorer import load_module
from stages.rl import agent
from stages.rl.turn_params import TurnParams


class RewardWorker:
    """A plain class, as the other RL workers: a Ray actor in the pipeline, an object in a one-process run."""

    def __init__(self, threads: int):
        dist_env.prepare_process(threads)
        self.episodes: agent.Episodes | None = None
        self.scorer: RewardSource | None = None

    def ready(self) -> bool:
        return True

    def setup(self, cfg: PipelineConfig, given: NodeInputs, models: list[str], cwd: str) -> None:
        """Build the scorer (`models`: the names of the pipeline's own reward models among the stage's
        inputs): in a call rather than the constructor, so that a bad reward config reaches the driver as
        the RewardError it is (a constructor's error kills the actor, and Ray prints its traceback)."""
        from stages.rewards.factory import build_scorer

        os.chdir(cwd)  # a relative reward.func_path means what it meant to the user
        # an agent's episodes give their own rewards: the reward section then scores nothing here (and an
        # executor with its own `execute` plays its episodes in the driver: nothing is held here either)
        if cfg.rl.agent.path:
            path = agent.resolve(cfg.rl.agent.path)
            module = load_module(path)
            self.episodes = None if agent.own_executor(module) else agent.Episodes(path, module)
            return
        self.scorer = build_scorer(cfg.reward, {name: given.path(name) for name in models},
                                   offload=cfg.rl.placement.reward_offload)
        if "torch" in sys.modules:  # a model scores here (a rule function's worker imports no torch, and needs none)
            determinism.apply(cfg.infra.deterministic)

    def score(self, prompts: list[str], responses: list[str], labels: list[str | None]):
        if self.scorer is None:
            raise RuntimeError("a reward worker with rl.agent.path scores no rollouts; the agent's episodes give the rewards")
        return self.scorer.score(prompts, responses, labels)

    def agent_reset(self, prompts: list[str], labels: list[str | None]) -> list[str]:
        return self.held_episodes().reset(prompts, labels)

    def agent_step(self, episodes: list[int], observations: list[str], actions: list[str],
                   params: list[TurnParams]) -> list[tuple[float, str, bool, TurnParams]]:
        return self.held_episodes().step(episodes, observations, actions, params)

    def agent_outcomes(self) -> list[tuple[float | None, dict[str, float]]]:
        return self.held_episodes().outcomes()

    def held_episodes(self) -> agent.Episodes:
        if self.episodes is None:
            raise RuntimeError("a reward worker without rl.agent.path holds no episodes; the driver runs them only with one")
        return self.episodes
