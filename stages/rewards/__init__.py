"""One reward interface over every source: reward models, a process reward model, a Python rule,
and a remote server. `build_scorer(cfg.reward, ...)` picks one; `score(prompts, responses, labels)`
returns a `RewardBatch`. The HTTP server (`stages.rewards.server`) is imported on its own."""

from stages.rewards.base import RewardBatch, RewardSource
from stages.rewards.errors import RewardError
from stages.rewards.factory import build_scorer, resolve_func_path
from stages.rewards.function import FunctionScorer
from stages.rewards.process_reward import ProcessRewardScorer, aggregate, split_steps
from stages.rewards.remote import RemoteScorer
from stages.rewards.reward_model import RewardModelScorer, load_reward_model

__all__ = [
    "FunctionScorer",
    "ProcessRewardScorer",
    "RemoteScorer",
    "RewardBatch",
    "RewardError",
    "RewardModelScorer",
    "RewardSource",
    "aggregate",
    "build_scorer",
    "load_reward_model",
    "resolve_func_path",
    "split_steps",
]
