"""Rule-based rewards from a Python file defining `reward_func(queries, prompts, labels, **kwargs)` (OpenRLHF's
convention). It returns the rewards (a tensor or list of floats), or OpenRLHF's dict: `rewards` (what the
advantages are computed from), optional `scores` (what dynamic filtering reads; alone, they are the rewards
too) and optional `extra_logs`, whose values are averaged into floats for the metrics log.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

from configs.errors import RewardError, first_line
from stages import openrlhf_compat
from stages.common import worker_imports
from stages.rewards.base import RewardBatch, as_rewards, check_batch, mean_logs


def load_module(path: Path) -> ModuleType:
    """Import a file by path, under a name unique to it (two reward files never collide in sys.modules)."""
    if not path.is_file():
        raise RewardError(f"reward function file {path}: no such file")
    name = "reward_func_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RewardError(f"reward function file {path}: cannot be imported (expected a .py file)")
    module = importlib.util.module_from_spec(spec)
    openrlhf_compat.provide()  # a file written for OpenRLHF imports its names
    worker_imports.lift_marks()  # a user's file may use what the stages leave unimported
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: any error is theirs to fix, reported in one line
        raise RewardError(f"reward function file {path}: import failed ({type(exc).__name__}: {first_line(exc)})") from exc
    return module


class FunctionScorer:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        func = getattr(load_module(self.path), "reward_func", None)
        if not callable(func):
            raise RewardError(f"reward function file {self.path}: defines no reward_func(queries, prompts, labels)")
        try:
            inspect.signature(func).bind([], [], [])
        except TypeError as exc:
            raise RewardError(f"reward function file {self.path}: reward_func cannot be called as "
                              f"reward_func(queries, prompts, labels) ({first_line(exc)})") from None
        except ValueError:  # no signature to read (some builtins): the call will tell
            pass
        self.func: Callable = func

    def score(self, prompts: list[str], responses: list[str], labels: list[str | None]) -> RewardBatch:
        check_batch(prompts, responses, labels)
        queries = [p + r for p, r in zip(prompts, responses)]
        where = f"reward_func in {self.path}"
        try:
            result = self.func(queries, prompts, labels)
        except Exception as exc:
            raise RewardError(f"{where} raised {type(exc).__name__}: {first_line(exc)}") from exc
        logs, scores = None, None
        if isinstance(result, Mapping):
            key = "rewards" if "rewards" in result else "scores" if "scores" in result else None
            if key is None:
                raise RewardError(f"{where} returned a dict without 'rewards' or 'scores' (keys: {sorted(result)})")
            if key == "rewards" and result.get("scores") is not None:
                scores = as_rewards(result["scores"], len(queries), f"{where} (scores)")
            result, logs = result[key], result.get("extra_logs")
        return RewardBatch(rewards=as_rewards(result, len(queries), where), extra_logs=mean_logs(logs, where),
                           scores=scores)
