"""When `rlhf run` starts the Ray cluster before the flow: only on a new local store, where no stage
can be cached (a cached run must stay free of Ray), and never for a cluster the user named."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from configs import load_config
from flows.cli import new_store
from flows.ray_cluster import named_address


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    for key in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    return load_config(None, [f"tracking.state_dir={tmp_path / 'state'}"])


def test_a_store_without_its_database_is_new(cfg, tmp_path):
    assert new_store(cfg)


def test_a_store_with_its_database_is_not(cfg, tmp_path):
    (tmp_path / "state").mkdir()
    with contextlib.closing(sqlite3.connect(tmp_path / "state" / "mlflow.db")) as db, db:
        db.execute("CREATE TABLE experiments (name TEXT)")
    assert not new_store(cfg)


def test_a_tracking_server_is_never_new(cfg, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert not new_store(cfg)


def test_a_cluster_is_named_by_ray_address_first_then_by_the_config(cfg, monkeypatch):
    assert named_address(cfg.infra) is None
    named = cfg.infra.model_copy(update={"ray_address": "127.0.0.1:6379"})
    assert named_address(named) == "127.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert named_address(cfg.infra) == named_address(named) == "10.0.0.1:6379"
