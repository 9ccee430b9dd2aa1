"""The stage contract: what a stage receives and what it hands back."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from configs.schema import PipelineConfig

MetricsCallback = Callable[[dict[str, float], int], None]


def _no_metrics(metrics: dict[str, float], step: int) -> None:
    """Default sink when a stage runs outside a tracked pipeline."""


def _kept_locally(ckpt_dir: Path, tag: str) -> None:
    """Default checkpoint sink: the work dir itself is where a rerun finds it."""


def _never() -> bool:
    """Default stop check: nothing asks the stage to stop."""
    return False


@dataclass
class StageContext:
    """Everything a stage needs besides its inputs.

    `output_dir` is a fresh directory: a stage writes each named output to `output_dir / name`
    and nothing of it is published unless the stage returns normally. `work_dir` survives a
    failed or killed run with the same fingerprint, so long stages keep resumable state there.
    """

    stage: str
    config: PipelineConfig
    output_dir: Path
    work_dir: Path
    log_metrics: MetricsCallback = _no_metrics
    # true once the run is being stopped (Ctrl-C): a driver stage, which runs in a thread of the flow
    # process where no KeyboardInterrupt lands, checks it between steps
    should_stop: Callable[[], bool] = _never
    rank: int = 0
    world_size: int = 1
    # called on every rank once checkpoint `tag` of a folder in `work_dir` is written (DeepSpeed's
    # `latest` naming it): on nodes without a shared disk it goes to the tracking server for a rerun
    on_checkpoint: Callable[[Path, str], None] = _kept_locally
    # with no disk shared between nodes: the stage's inputs (or the named ones) downloaded to the node it is
    # called on, for workers a driver stage starts on other nodes (`node_inputs`)
    fetch_inputs: Callable[..., dict[str, Path]] | None = None
    # what an earlier run of this stage computed for some of its inputs that are unchanged, by input, for
    # the stage to take instead of computing it again (eval: a model's metrics and samples; flows/eval_reuse.py)
    prior_results: dict[str, dict] = field(default_factory=dict)
    # Unix seconds the stage function started (set by `run_timed`): what `time/first_step_s` counts from
    started: float | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class NodeInputs:
    """A driver stage's inputs as the workers it starts read them, on whichever node each runs: the paths
    the stage was given, or, where nodes share no disk (`fetch`: `StageContext.fetch_inputs`), this node's
    copy, downloaded once per node."""

    paths: dict[str, str]
    fetch: Callable[..., dict[str, Path]] | None = None

    def path(self, name: str) -> str:
        return self.paths[name] if self.fetch is None else str(self.fetch([name])[name])


def node_inputs(ctx: StageContext, inputs: dict[str, Path]) -> NodeInputs:
    return NodeInputs({name: str(path) for name, path in inputs.items()}, ctx.fetch_inputs)


@dataclass
class StageResult:
    outputs: dict[str, Path]
    metrics: dict[str, float] = field(default_factory=dict)
    # wall-clock start and end (Unix seconds) of the stage function itself, set by `run_timed`:
    # what the stage computed, as opposed to orchestration (Ray start, actor start-up, publishing)
    compute_span: tuple[float, float] | None = None


def run_timed(stage_fn: Callable[[StageContext, dict[str, Path]], StageResult], ctx: StageContext,
              inputs: dict[str, Path]) -> StageResult:
    """Call a stage function and stamp its result with the span it ran."""
    start = ctx.started = time.time()
    result = stage_fn(ctx, inputs)
    result.compute_span = (start, time.time())
    return result
