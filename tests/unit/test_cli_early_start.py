"""When `rlhf run` starts the Ray cluster before the flow: only on a new local store, where no stage
can be cached (a cached run must stay free of Ray), and never for a cluster the user named."""

from __future__ import annotations

import contextlib
import sqlite3
import threading

import pytest

from configs import load_config
from flows.cli.main import new_store
from flows.services.ray_cluster import named_address


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


def planned_preloads(cfg, scheduled: set[str]) -> dict[str, set[str]]:
    from flows.services.ray_cluster import RaySession

    session = RaySession(cfg.infra)
    session.preload_drivers(cfg, scheduled)
    return session.preload


def test_the_rl_module_is_imported_once_a_stage_it_consumes_runs(cfg):
    from stages.dag import declaration as dag

    every = {s.name for s in dag.STAGES}
    # the tiny preset's RL reads data prep's prompts and the SFT policy (its reward is a rule): rm running
    # says nothing about whether RL will
    assert planned_preloads(cfg, every) == {"data_prep": {"runtime.rl_driver"}, "sft": {"runtime.rl_driver"}}
    with_rm = load_config(None, ["reward.source=rm", f"tracking.state_dir={cfg.tracking.state_dir}"])
    assert planned_preloads(with_rm, every)["rm"] == {"runtime.rl_driver"}
    assert planned_preloads(cfg, every - {"rl"}) == {}  # `--only` without RL, or RL pinned away
    assert planned_preloads(cfg, {"rl", "sft"}) == {"sft": {"runtime.rl_driver"}}  # data prep reused, not run


def test_a_preload_starts_with_the_first_stage_that_runs_and_only_once(cfg, monkeypatch):
    from flows.services import ray_cluster

    started = []
    monkeypatch.setattr(ray_cluster, "import_all", started.append)
    session = ray_cluster.RaySession(cfg.infra)
    session.preload = {"data_prep": {"runtime.rl_driver"}, "sft": {"runtime.rl_driver"}}
    session.start_preloads("sft")
    session.start_preloads("data_prep")
    session.start_preloads("eval")
    for thread in [t for t in threading.enumerate() if t.name == "preload-drivers"]:
        thread.join()
    assert started == [["runtime.rl_driver"]]
