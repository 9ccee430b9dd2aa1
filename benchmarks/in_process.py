"""Running one stage inside the benchmark's own process, outside the pipeline (no MLflow, no Ray
for the training stages): what the trials of the throughput benchmarks do."""

from __future__ import annotations

import os
from pathlib import Path


def single_rank_env() -> None:
    """torch.distributed settings for one in-process DeepSpeed rank on the CPU."""
    from stages.common import dist_env

    os.environ.update(dist_env.single_rank_env(), DS_ACCELERATOR="cpu")


def make_ctx(stage: str, cfg, root: Path, log=None):
    from stages.dag.contract import StageContext

    ctx = StageContext(stage=stage, config=cfg, output_dir=root / "output", work_dir=root / "work")
    ctx.output_dir.mkdir(parents=True)
    if log is not None:
        ctx.log_metrics = log
    return ctx
