"""Running one stage inside the benchmark's own process, outside the pipeline (no MLflow, no Ray
for the training stages): what the trials of the throughput benchmarks do."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def single_rank_env() -> None:
    """torch.distributed settings for one in-process DeepSpeed rank."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      DS_ACCELERATOR="cpu")


def make_ctx(stage: str, cfg, root: Path, log=None):
    from stages.contract import StageContext

    ctx = StageContext(stage=stage, config=cfg, output_dir=root / "output", work_dir=root / "work")
    ctx.output_dir.mkdir(parents=True)
    if log is not None:
        ctx.log_metrics = log
    return ctx
