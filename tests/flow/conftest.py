"""End-to-end tests drive the real `rlhf` CLI in a subprocess: real Prefect (temporary server),
a real local Ray cluster, real DeepSpeed engines and an MLflow SQLite store in a temp folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "flows.cli"]


def cli_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    env.pop("PREFECT_API_URL", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], cwd=workdir, env=cli_env(workdir), capture_output=True, text=True, timeout=timeout
    )


def mlflow_client(workdir: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{workdir / '.rlhf' / 'mlflow.db'}")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
