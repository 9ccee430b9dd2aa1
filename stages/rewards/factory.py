"""Pick the reward source the `reward` config section asks for."""

from __future__ import annotations

from pathlib import Path

from configs.schema import RewardConfig
from stages.reward_file import resolve_func_path
from stages.rewards.base import RewardSource
from stages.rewards.errors import RewardError
from stages.rewards.function import FunctionScorer
from stages.rewards.process_reward import ProcessRewardScorer
from stages.rewards.remote import RemoteScorer
from stages.rewards.reward_model import RewardModelScorer


def build_scorer(cfg: RewardConfig, own_rm: Path | None = None, own_prm: Path | None = None) -> RewardSource:
    """The scorer for `cfg.source`; `own_rm`/`own_prm` are the pipeline's own checkpoints, used when
    the config names none."""
    if cfg.source == "func":
        return FunctionScorer(resolve_func_path(cfg.func_path))
    if cfg.source == "remote":
        if not cfg.url:
            raise RewardError("reward.source=remote needs reward.url (e.g. http://127.0.0.1:5001/get_reward)")
        return RemoteScorer(cfg.url, cfg.timeout_s, cfg.retries, batch_size=cfg.batch_size)
    if cfg.source == "rm":
        paths = list(cfg.rm_paths) or ([own_rm] if own_rm is not None else [])
        if not paths:
            raise RewardError("reward.source=rm: no reward model (reward.rm_paths is empty and the pipeline has none of its own)")
        return RewardModelScorer(paths, cfg.batch_size)
    if cfg.source == "prm":
        path = cfg.prm_path or own_prm
        if path is None:
            raise RewardError("reward.source=prm: no process reward model (reward.prm_path is empty and the pipeline has none of its own)")
        return ProcessRewardScorer(path, cfg.prm_aggregate, cfg.batch_size)
    raise RewardError(f"reward.source={cfg.source}: unknown (expected rm, prm, func or remote)")
