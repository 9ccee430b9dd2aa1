"""A damaged, empty or full MLflow store, and runs a killed `rlhf run` left open: each ends in one
line naming the file and what to do (or, for the killed run, in runs shown FAILED), with no traceback
and nothing started or made."""

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from artifacts import run_tags
from tests.flow.conftest import CLI, cli_env, mlflow_client
from tests.full_disk import sqlite_cannot_grow, tmpfs_mounts

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

MOVE_IT_AWAY = "; move it away to start a new store, or restore it from a backup"


@pytest.fixture(scope="module")
def store_with_history(tmp_path_factory) -> Path:
    """An MLflow store with one finished pipeline run, made by MLflow."""
    from mlflow import MlflowClient
    from mlflow.entities import RunStatus

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.create_experiment("rlhf-pipeline", artifact_location=(db.parent / "mlartifacts").as_uri())
    run = client.create_run(experiment, tags={"rlhf.kind": "pipeline", "rlhf.config": "tiny"})
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
    return db


@pytest.fixture
def db(workdir, store_with_history) -> Path:
    path = workdir / ".rlhf" / "mlflow.db"
    path.parent.mkdir()
    shutil.copyfile(store_with_history, path)
    return path


def one_error_line(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    return line


def test_a_truncated_store_stops_runs_and_run_before_anything_starts(cli, workdir, db):
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.truncate(size // 2)
    expected = f"error: {db} is damaged (truncated: {size // 2} bytes, its header says {size}){MOVE_IT_AWAY}"
    for command in (["runs"], ["run"]):
        result = cli(*command)
        assert result.stderr.strip() == expected
        assert one_error_line(result) == expected
    assert db.stat().st_size == size // 2  # untouched
    assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db"]  # no Prefect home, no work dir


def test_an_empty_store_file_is_not_taken_for_a_new_store(cli, db):
    db.write_bytes(b"")
    expected = (f"error: {db} is an empty file where the MLflow store should be (its runs are lost, or it was "
                f"never written){MOVE_IT_AWAY}")
    for command in (["runs"], ["run"]):
        assert cli(*command).stderr.strip() == expected
    assert db.stat().st_size == 0  # not silently made a new, empty store


def test_a_store_without_room_is_one_line_and_left_unmade(cli, workdir, prefect_server, monkeypatch):
    """The first thing the flow writes is the new store's tables; the store cannot grow (see
    tests/full_disk.py): one line naming it, the flow run Failed without a Prefect traceback, and no
    half-made database left to stop the next run."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    with sqlite_cannot_grow():
        result = cli("run", "--only", "data_prep")
    db = workdir / ".rlhf" / "mlflow.db"
    assert one_error_line(result) == f"error: no space left on device writing {db}: free space and rerun to resume"
    assert not db.exists()


def test_a_full_disk_stops_run_before_anything_starts(cli, tmp_path):
    """The state folder's disk is full already: one line, before the state folder, Prefect's or MLflow's
    database is begun (`rlhf check` says the same)."""
    with tmpfs_mounts(tmp_path) as mount:
        disk = mount("64k")
        with open(disk / "filler", "wb") as filler, contextlib.suppress(OSError):
            filler.write(bytes(1 << 20))
        for command in ("run", "check"):
            result = cli(command, f"tracking.state_dir={disk / '.rlhf'}")
            assert result.stderr.strip() == (f"error: no space left on device writing {disk / '.rlhf'} (0.0 MiB free): "
                                              "free space and rerun to resume")
        assert not (disk / ".rlhf").exists()


def running_runs(db: Path) -> int:
    try:
        with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as con:
            return con.execute("SELECT count(*) FROM runs WHERE status = 'RUNNING'").fetchone()[0]
    except sqlite3.Error:  # not made yet, or MLflow is making its tables
        return 0


def test_runs_a_killed_pipeline_left_open_are_shown_failed(cli, workdir, prefect_server):
    """SIGKILL `rlhf run` (and all it started) once its pipeline and first stage runs are open: the next
    `rlhf runs` shows the pipeline run FAILED, and both runs say why in `rlhf.error`."""
    db = workdir / ".rlhf" / "mlflow.db"
    proc = subprocess.Popen([*CLI, "run", "--only", "data_prep"], cwd=workdir, env=cli_env(workdir),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while running_runs(db) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "rlhf run did not open its runs"
            time.sleep(0.2)
    finally:
        started = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        for child in started:  # anything that left the session (Ray's processes) goes too
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    result = cli("runs")
    assert result.returncode == 0, result.stderr
    runs = mlflow_client(workdir).search_runs(mlflow_client(workdir).search_experiments()[0].experiment_id)
    assert {r.data.tags.get(run_tags.TAG_STAGE, "pipeline"): r.info.status for r in runs} == {"pipeline": "FAILED", "data_prep": "FAILED"}
    why = f"the process that ran it ended without closing it (pid {proc.pid} on {socket.gethostname()})"
    assert {r.data.tags["rlhf.error"] for r in runs} == {why}
    (pipeline,) = [r for r in runs if run_tags.TAG_STAGE not in r.data.tags]
    assert pipeline.info.run_id in result.stdout and "FAILED" in result.stdout and "RUNNING" not in result.stdout
