"""Where MLflow lives: a SQLite store and an artifact root under the project's state folder by
default (absolute paths), `MLFLOW_TRACKING_URI` or `tracking.uri` otherwise."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from configs.schema import TrackingConfig


@dataclass(frozen=True)
class TrackingSetup:
    uri: str
    experiment: str
    state_dir: Path

    @property
    def artifact_root(self) -> str:
        return (self.state_dir / "mlartifacts").as_uri()

    def ui_command(self) -> str:
        return f"mlflow ui --backend-store-uri {self.uri}"


def resolve_uri(cfg: TrackingConfig) -> str:
    """The tracking URI `resolve` will use, without creating anything."""
    state_dir = Path(cfg.state_dir).expanduser().resolve()
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg.uri or f"sqlite:///{state_dir / 'mlflow.db'}"


def resolve(cfg: TrackingConfig) -> TrackingSetup:
    state_dir = Path(cfg.state_dir).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    uri = resolve_uri(cfg)
    # The registry follows the tracking store; set both for every MLflow client in this process.
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return TrackingSetup(uri=uri, experiment=cfg.experiment, state_dir=state_dir)


def experiment_id(client, setup: TrackingSetup) -> str:
    found = client.get_experiment_by_name(setup.experiment)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(setup.experiment, artifact_location=setup.artifact_root)
    except Exception:  # another pipeline run created it first
        return client.get_experiment_by_name(setup.experiment).experiment_id
