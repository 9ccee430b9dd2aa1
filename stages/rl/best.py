"""rl.best_metric (OpenRLHF's --ckpt.best_metric_key): the held-out eval step with the highest metric gives the
stage's output policy. Each new best is exported at once (as the stage would have saved its output had the run
ended there) into the work dir's `checkpoints/best/step<N>`; the resumable checkpoints record which step is
the best, so a resumed run goes on from the same one. A best export newer than the last resumable checkpoint
stays beside the one that checkpoint records until the next checkpoint records it."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from configs.errors import ConfigError
from stages.common.deepspeed_engine import RESUME_TAG, TAG


@dataclass
class BestStep:
    """The best eval so far by `metric`: its step (None before the first) and its metrics."""

    metric: str
    step: int | None = None
    evals: dict[str, float] = field(default_factory=dict)

    @property
    def value(self) -> float:
        return -math.inf if self.step is None else self.evals[self.metric]

    def offer(self, step: int, evals: dict[str, float]) -> bool:
        """Take the eval at `step` if its metric is higher than the best's (a tie keeps the earlier step, as
        OpenRLHF's strict comparison does); whether it did."""
        if reported(self.metric, evals) > self.value:
            self.step, self.evals = step, dict(evals)
            return True
        return False

    def state(self) -> dict:
        return {"step": self.step, "evals": self.evals}

    @classmethod
    def restored(cls, metric: str, state: dict | None) -> BestStep:
        return cls(metric) if state is None else cls(metric, state["step"], state["evals"])


def reported(metric: str, evals: dict[str, float]) -> float:
    """`evals[metric]`; the one metric the config cannot promise is pass@k, reported only for 0/1 rewards."""
    if metric not in evals:
        raise ConfigError(f"rl.best_metric={metric}: the held-out evals do not report it (pass@k only when every sampled "
                          f"reward is 0 or 1; they report {', '.join(sorted(evals))}): pick one of those")
    return evals[metric]


class BestFolder:
    """`checkpoints/best` in the work dir: one folder per kept best export, `latest` naming the newest (so that a
    rerun on another node downloads it, `artifacts.node_files`)."""

    def __init__(self, path: Path, on_checkpoint: Callable[[Path, str], None]):
        self.path, self.on_checkpoint = path, on_checkpoint
        self.recorded: int | None = None  # the best step the newest resumable checkpoint records

    def tag(self, step: int) -> Path:
        return self.path / f"step{step}"

    def exported(self, step: int) -> None:
        """Best export `step` is written (into `tag(step)`): named newest, announced, and the older ones that no
        checkpoint needs deleted."""
        (self.path / RESUME_TAG).write_text(f"step{step}")
        self.on_checkpoint(self.path, f"step{step}")
        self.keep_only({step, self.recorded})

    def checkpointed(self, best: int | None) -> None:
        """A resumable checkpoint records `best`: the exports before it are not needed again."""
        self.recorded = best
        self.keep_only({best})

    def resumed(self, best: int | None) -> bool:
        """A resumed run goes on from the checkpoint's `best`: later exports (of steps it does again) go; whether
        that best's export is here."""
        self.checkpointed(best)
        if best is None:
            return True
        if not self.tag(best).is_dir():
            return False
        (self.path / RESUME_TAG).write_text(f"step{best}")
        return True

    def keep_only(self, steps: set[int | None]) -> None:
        if not self.path.is_dir():
            return
        for child in self.path.iterdir():
            if child.is_dir() and (m := TAG.match(child.name)) and int(m.group(1)) not in steps:
                shutil.rmtree(child, ignore_errors=True)

    def copy_to(self, step: int, out: Path) -> None:
        """Export `step` as the stage's output: hard links where the two folders share a file system, else a copy."""
        shutil.copytree(self.tag(step), out, copy_function=link_or_copy)


def link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
