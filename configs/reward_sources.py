"""The reward sources (`reward.source`), declared once: what each reads and which of the pipeline's own
artifacts it consumes. The schema validates against this registry, the DAG reads from it which inputs
a scoring stage takes, and `stages/rewards/factory.py` builds each source's scorer by its name."""

from __future__ import annotations

from dataclasses import dataclass

from configs.registry import Registry


@dataclass(frozen=True)
class RewardSourceSpec:
    name: str
    about: str = ""  # what it is, for the config reference
    paths: tuple[str, ...] = ()  # `reward` keys naming local files it reads (their content counts in the fingerprints)
    own_model: str | None = None  # the pipeline's artifact it scores with when its `paths` name none
    timed: bool = False  # the RL stage ends a scoring call after reward.timeout_s (user code: nothing else stops it)


REWARD_SOURCES = Registry("reward source", (
    RewardSourceSpec("rm", "reward models", paths=("rm_paths",), own_model="reward_model"),
    RewardSourceSpec("prm", "a process reward model", paths=("prm_path",), own_model="prm"),
    RewardSourceSpec("func", "a reward_func file", paths=("func_path",), timed=True),
    RewardSourceSpec("remote", "an HTTP reward server"),
))


def own_models() -> tuple[str, ...]:
    """Every pipeline artifact some source scores with (the DAG's optional reward inputs)."""
    return tuple(dict.fromkeys(s.own_model for s in REWARD_SOURCES.values() if s.own_model))


def path_keys() -> tuple[str, ...]:
    """The dotted config keys of every local file some source reads."""
    return tuple(dict.fromkeys(f"reward.{key}" for s in REWARD_SOURCES.values() for key in s.paths))


def consumed_model(reward) -> str | None:
    """The pipeline artifact the `reward` section scores with: its source's own model, unless the
    section names files of its own (`reward.rm_paths`, `reward.prm_path`)."""
    spec = REWARD_SOURCES[reward.source]
    if spec.own_model is None or any(getattr(reward, key) for key in spec.paths):
        return None
    return spec.own_model
