"""What a stage run holds, for comparison: each artifact file's SHA-256 by its path in the run, and each metric's
history. A local store's files are read where they lie; a tracking server's are downloaded to a scratch folder."""

from __future__ import annotations

from pathlib import Path

import mlflow
from mlflow import MlflowClient

from artifacts import tracking
from artifacts.file_hashes import sha256

# MLflow's record of a logged model: its run, its inputs' runs and when it was logged (this store's ids and
# times, not the stage's work)
MLMODEL = "MLmodel"


def artifact_root(client: MlflowClient, run, scratch: Path) -> Path:
    """The folder holding `run`'s artifacts on this machine: the store's own, or a copy under `scratch`."""
    local = tracking.artifact_dir(run.info.artifact_uri)
    if local is not None:
        return local
    target = scratch / run.info.run_id
    if not target.exists():
        target.mkdir(parents=True)
        mlflow.artifacts.download_artifacts(run_id=run.info.run_id, dst_path=str(target), tracking_uri=client.tracking_uri)
    return target


def output_digests(client: MlflowClient, run, scratch: Path) -> dict[str, str]:
    """`{relative path: sha256}` of every file the run's artifacts hold but `MLmodel` records."""
    root = artifact_root(client, run, scratch)
    if not root.is_dir():
        return {}
    return {f.relative_to(root).as_posix(): sha256(f) for f in sorted(root.rglob("*")) if f.is_file() and f.name != MLMODEL}


def histories(client: MlflowClient, run) -> dict[str, list[tuple[int, float]]]:
    """`{metric: [(step, value), ...]}` in the order of steps (points of one step in the order logged)."""
    return {key: sorted(((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)), key=lambda p: p[0])
            for key in sorted(run.data.metrics)}
