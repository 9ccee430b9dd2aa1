"""The driver's side of multi-turn RL (`rl.agent.path`, stages/rl/agent.py): episodes played turn by
turn. Each turn the engines answer every open episode's context (one `generate` call), the reward
workers step those episodes' environments, and each environment's next observation is appended to its
context as tokens the policy did not sample. An episode comes back as one `Sample` (its answers and
observations as one response, the answers marked as trained) and its turns' rewards."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

import torch

from configs.errors import DataError, RewardError
from stages.rewards.base import RewardBatch
from stages.rewards.func_scorer import load_module
from stages.rl.agent import own_executor, resolve
from stages.rl.executor_run import run_executor
from stages.rl.experience import Sample
from stages.rl.generation import Sampling, collect_generation, launch_generation
from stages.rl.reward_worker import RewardWorker
from stages.rl.turn_params import TurnParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from configs.schema import PipelineConfig



class Playing(Sampling, Protocol):
    """What episodes need of the driver's workers (stages.rl.stage.Actors): samplers and the reward workers."""

    @property
    def reward(self) -> Sequence[RewardWorker]: ...


class Hosts:
    """The reward workers holding a batch of episodes, an equal contiguous share each."""

    def __init__(self, actors: Playing, count: int, cfg: PipelineConfig):
        self.actors, self.cfg = actors, cfg
        k = math.ceil(count / len(actors.reward))
        self.shares = [(w, i * k, min((i + 1) * k, count)) for i, w in enumerate(actors.reward) if i * k < count]

    def call(self, method: Callable[[RewardWorker], Callable[..., list[Any]]], episodes: list[int], *columns: list,
             indexed: bool = True) -> list:
        """`method(worker)(local indices, *columns)` on each worker for the given episodes (global indices), within
        `rl.agent.timeout_s`; the results in the order of `episodes`. `indexed=False`: `method(worker)(*columns)`,
        for a call that covers a worker's whole share in order (reset)."""
        b, rl = self.actors.backend, self.cfg.rl
        calls = []
        for worker, first, end in self.shares:
            mine = [n for n, e in enumerate(episodes) if first <= e < end]
            if mine:
                args = [[episodes[n] - first for n in mine], *([col[n] for n in mine] for col in columns)]
                calls.append((mine, b.call(method(worker), *(args if indexed else args[1:]))))
        try:
            parts = b.get([pending for _, pending in calls], timeout=rl.agent.timeout_s)
        except TimeoutError:
            for worker, _, _ in self.shares:
                b.kill(worker)
            what = "reset" if not indexed else "step"
            raise RewardError(f"rl.agent.path={rl.agent.path}: Environment.{what} did not return within "
                              f"rl.agent.timeout_s={rl.agent.timeout_s:g} s; fix the environment or raise "
                              "rl.agent.timeout_s") from None
        out: list = [None] * len(episodes)
        for (mine, _), results in zip(calls, parts):
            for n, result in zip(mine, results):
                out[n] = result
        return out


@cache
def own_executor_of(path: str) -> type | None:
    """The agent file's executor class where it owns its episodes (loaded once in the driver), else None."""
    return own_executor(load_module(resolve(path)))


def run_episodes(actors: Playing, tokenizer: PreTrainedTokenizerBase, texts: list[str], labels: list[str | None], cfg: PipelineConfig, seed: int,
                 temperature: float | None, max_new_tokens: int, top_p: float = 1.0) -> tuple[list[Sample], RewardBatch]:
    """One episode per prompt text. The returned rewards are each episode's return (the sum of its turns'
    rewards: what group estimators compare), `step_rewards` its turns' rewards (placed on each answer's
    last token for the token-level estimators). An executor with its own `execute` plays its episodes in
    the driver (stages/rl/executor_run.py); every other agent file's turns are played here."""
    rl = cfg.rl
    assert rl.agent.path is not None, "run_episodes without rl.agent.path"
    executor = own_executor_of(rl.agent.path)
    if executor is not None:
        samples, played, outcomes = run_executor(
            executor, resolve(rl.agent.path), lambda ids, params, s: generate_by_params(actors, ids, params, s),
            tokenizer, texts, labels, cfg, seed, TurnParams(temperature, top_p, max_new_tokens))
        steps = [[0.0] * (len(s.turn_ends or []) - 1) + [r] for s, r in zip(samples, played)]
        return samples, episode_batch(torch.tensor(played, dtype=torch.float32), steps, outcomes)
    hosts = Hosts(actors, len(texts), cfg)
    every = list(range(len(texts)))
    observations = hosts.call(lambda w: w.agent_reset, every, texts, labels, indexed=False)
    contexts = []
    for i, text in enumerate(observations):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids or len(ids) > rl.rollout.prompt_max_len:
            raise DataError(f"rl.agent.path={rl.agent.path}: Environment.reset's first observation for prompt {i} is "
                            f"{len(ids)} tokens; it must be 1 to rl.rollout.prompt_max_len={rl.rollout.prompt_max_len}")
        contexts.append(ids)
    response: list[list[int]] = [[] for _ in texts]
    trained: list[list[int]] = [[] for _ in texts]
    log_probs: list[list[float]] = [[] for _ in texts]
    ends: list[list[int]] = [[] for _ in texts]
    rewards: list[list[float]] = [[] for _ in texts]
    params = [TurnParams(temperature, top_p, max_new_tokens)] * len(texts)
    active = every
    for turn in range(rl.agent.max_turns):
        answers = generate_by_params(actors, [contexts[i] + response[i] for i in active], [params[i] for i in active],
                                     seed + 7919 * turn)
        for i, s in zip(active, answers):
            response[i] += s.response_ids
            trained[i] += [1] * len(s.response_ids)
            log_probs[i] += s.log_probs
            ends[i].append(len(response[i]) - 1)
        actions = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for s in answers]
        results = hosts.call(lambda w: w.agent_step, active, [observations[i] for i in active], actions,
                             [params[i] for i in active])
        still = []
        for i, (reward, observation, done, next_params) in zip(active, results):
            rewards[i].append(reward)
            params[i] = next_params.capped(max_new_tokens)
            if done or turn + 1 == rl.agent.max_turns:
                continue
            ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
            response[i] += ids
            trained[i] += [0] * len(ids)
            log_probs[i] += [0.0] * len(ids)
            observations[i] = observation
            still.append(i)
        active = still
        if not active:
            break
    samples = [Sample(contexts[i], response[i], log_probs[i], trained[i], ends[i]) for i in every]
    returns = torch.tensor([sum(r) for r in rewards], dtype=torch.float32)
    outcomes = hosts.call(lambda w: w.agent_outcomes, every, indexed=False)
    return samples, episode_batch(returns, rewards, outcomes)


def generate_by_params(actors: Playing, contexts: list[list[int]], params: list[TurnParams], seed: int) -> list[Sample]:
    """One turn's answers, one `generate` call per distinct setting (most turns: one), all launched before any is
    collected, in the contexts' order; the k-th setting's call seeded `seed + 104729 * k` (settings in order of
    first use)."""
    groups: dict[TurnParams, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(p, []).append(i)
    launched = [(members, launch_generation(actors, [contexts[i] for i in members], seed + 104729 * k, p.temperature,
                                            p.max_new_tokens, p.top_p, p.stop))
                for k, (p, members) in enumerate(groups.items())]
    answers: dict[int, Sample] = {}
    for members, pending in launched:
        answers |= dict(zip(members, collect_generation(actors, pending), strict=True))
    return [answers[i] for i in range(len(contexts))]


def episode_batch(returns: torch.Tensor, step_rewards: list[list[float]],
                  outcomes: list[tuple[float | None, dict[str, float]]]) -> RewardBatch:
    """The episodes' rewards (their returns) with the scores and logs their environments gave: an episode
    without a score is filtered on its return; a log is the mean over the episodes that have it."""
    scores = None
    if any(score is not None for score, _ in outcomes):
        scores = torch.tensor([r if score is None else score for r, (score, _) in zip(returns.tolist(), outcomes)],
                              dtype=torch.float32)
    keys = dict.fromkeys(k for _, logs in outcomes for k in logs)
    logs = {k: sum(v[k] for _, v in outcomes if k in v) / sum(k in v for _, v in outcomes) for k in keys}
    return RewardBatch(rewards=returns, step_rewards=step_rewards, extra_logs=logs, scores=scores)


def turns(samples: list[Sample]) -> float:
    """Mean turns per episode."""
    counts = []
    for s in samples:
        if s.turn_ends is None:
            raise ValueError("turns: a sample without turn_ends is not an episode of run_episodes")
        counts.append(len(s.turn_ends))
    return sum(counts) / len(samples)
