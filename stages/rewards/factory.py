"""Build the scorer of the reward source the `reward` config section names (the sources are declared in
configs/reward_sources.py; here, how each is built)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from configs.errors import RewardError
from configs.reward_sources import REWARD_SOURCES
from configs.schema import RewardConfig
from stages.rewards.base import RewardSource
from stages.rewards.func_file import resolve_func_path

# Each builder imports its scorer's module: a process that scores with a rule function (an RL reward
# worker) then never imports transformers or requests.


def reward_models(cfg: RewardConfig, own: Path | str | None, offload: bool) -> RewardSource:
    from stages.rewards.rm_scorer import RewardModelScorer

    paths: list[str | Path] = [*cfg.rm_paths] or ([own] if own is not None else [])
    if not paths:
        raise RewardError("reward.source=rm: no reward model (reward.rm_paths is empty and the pipeline has none of its own)")
    return RewardModelScorer(paths, cfg.batch_size, combine=cfg.rm_combine, normalize=cfg.normalize, offload=offload)


def process_reward_model(cfg: RewardConfig, own: Path | str | None, offload: bool) -> RewardSource:
    from stages.rewards.prm_scorer import ProcessRewardScorer

    path = cfg.prm_path or own
    if path is None:
        raise RewardError("reward.source=prm: no process reward model (reward.prm_path is empty and the pipeline has none of its own)")
    return ProcessRewardScorer(path, cfg.prm_aggregate, cfg.batch_size, offload=offload)


def reward_function(cfg: RewardConfig, own: Path | str | None, offload: bool) -> RewardSource:
    from stages.rewards.func_scorer import FunctionScorer

    return FunctionScorer(resolve_func_path(cfg.func_path))


def remote_server(cfg: RewardConfig, own: Path | str | None, offload: bool) -> RewardSource:
    from stages.rewards.remote import RemoteScorer

    if not cfg.url:
        raise RewardError("reward.source=remote needs reward.url (e.g. http://127.0.0.1:5001/get_reward)")
    return RemoteScorer(cfg.url, cfg.timeout_s, cfg.retries, batch_size=cfg.batch_size)


# each source's scorer from the `reward` section, the pipeline's own model (its spec's `own_model`) if any, and
# whether a model it loads stays in host memory between scoring calls
BUILDERS: dict[str, Callable[[RewardConfig, Path | str | None, bool], RewardSource]] = {
    "rm": reward_models,
    "prm": process_reward_model,
    "func": reward_function,
    "remote": remote_server,
}


def build_scorer(cfg: RewardConfig, models: Mapping[str, Path | str | None] | None = None, offload: bool = False) -> RewardSource:
    """The scorer for `cfg.source`; `models` are the pipeline's own artifacts by name (a stage's inputs),
    of which a source takes its `own_model` when the config names no files of its own. `offload`: a reward
    model's weights stay in host memory between scoring calls (rl.placement.reward_offload)."""
    build = BUILDERS.get(cfg.source)
    if build is None:
        raise RewardError(f"reward.source={cfg.source}: no scorer is built for it (expected {', '.join(BUILDERS)})")
    own_model = REWARD_SOURCES[cfg.source].own_model
    return build(cfg, (models or {}).get(own_model) if own_model else None, offload)
