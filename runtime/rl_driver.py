"""The RL stage as the pipeline runs it: the driver's loop (stages/rl/stage.py) over Ray actors placed on the
cluster's placement groups. The stage's entrypoint (stages/dag/declaration.py)."""

from __future__ import annotations

from pathlib import Path

from runtime.rl_actors import RayActors
from stages.dag.contract import StageContext, StageResult
from stages.rl.stage import run_with


def run(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    return run_with(RayActors(), ctx, inputs)
