"""A full disk is told apart from other failures and reported as one line naming what could not be
written, and a stage that runs out of space is a FAILED run, not a RUNNING one.

The file writes fill a real filesystem, a small tmpfs; the MLflow store's "database or disk is full"
comes from SQLite's own page quota (see tests/full_disk.py)."""

import errno
import shutil

import pytest
from mlflow import MlflowClient
from mlflow.entities import Param

from artifacts import disk_full, run_owner, run_tags, store, tracking
from configs import load_config
from configs.errors import PipelineError
from flows.services.ray_cluster import RaySession
from flows.stage_task import StageOutcome, execute_stage
from stages.dag import declaration as dag
from tests.full_disk import sqlite_cannot_grow, tmpfs_mounts

WHAT_TO_DO = ": free space and rerun to resume"


@pytest.fixture
def tmpfs(tmp_path):
    with tmpfs_mounts(tmp_path) as mount:
        yield mount


@pytest.fixture
def small_disk(tmpfs):
    return tmpfs("128k")


def raised(write) -> BaseException:
    with pytest.raises(Exception) as failed:  # noqa: PT011 - what a full disk raises differs by library; callers check it
        write()
    return failed.value


def test_file_writes_on_a_full_disk_name_the_file(small_disk, tmp_path):
    src = tmp_path / "model.safetensors"
    src.write_bytes(bytes(256 << 10))
    work = small_disk / "work"
    copy = raised(lambda: shutil.copy2(src, small_disk / "copy.safetensors"))  # how MLflow logs an artifact
    assert str(disk_full.no_space(copy, work)) == f"no space left on device writing {small_disk / 'copy.safetensors'}{WHAT_TO_DO}"
    write = raised(lambda: (small_disk / "state.json").write_bytes(bytes(256 << 10)))  # a write names no file
    assert str(disk_full.no_space(write, work)) == f"no space left on device writing {work}{WHAT_TO_DO}"


def test_checkpoint_writers_on_a_full_disk(small_disk):
    """safetensors says "os error 28"; torch.save's stream error carries no errno at all."""
    import torch
    from safetensors.torch import save_file

    weights = {"w": torch.zeros(64 << 10)}
    for save in (lambda: save_file(weights, small_disk / "model.safetensors"),
                 lambda: torch.save(weights, small_disk / "optim.pt")):
        error = raised(save)
        assert str(disk_full.no_space(error, small_disk)) == f"no space left on device writing {small_disk}{WHAT_TO_DO}"


def test_other_failures_are_not_a_full_disk(tmp_path):
    assert disk_full.no_space(ValueError("bad row"), tmp_path) is None
    assert disk_full.no_space(PermissionError(errno.EACCES, "Permission denied", str(tmp_path)), tmp_path) is None
    # torch's stream error while the disk has room: some other fault
    assert disk_full.no_space(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos"), tmp_path) is None


@pytest.mark.slow
def test_the_store_that_cannot_grow_is_named(client, tmp_path):
    run_id = client.create_run(client.exp).info.run_id
    with sqlite_cannot_grow():
        error = raised(lambda: client.log_batch(run_id, params=[Param(f"p{i}", "x" * 5000) for i in range(100)]))
    db = tmp_path / "mlflow.db"
    assert str(disk_full.no_space(error, tmp_path, db)) == f"no space left on device writing {db}{WHAT_TO_DO}"


def test_a_new_store_without_room_is_not_left_half_made(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no template: MLflow migrates a new file
    setup = tracking.resolve(load_config(None, [f"tracking.state_dir={tmp_path}"]).tracking)
    with sqlite_cannot_grow(), pytest.raises(PipelineError) as failed:
        tracking.open_store(setup)
    assert str(failed.value) == f"no space left on device writing {setup.sqlite_file}{WHAT_TO_DO}"
    assert not setup.sqlite_file.exists()  # the next run makes a whole one, not MLflow's "out-of-date schema"


def test_a_new_store_copied_from_its_template_without_room_is_not_left_half_made(tmp_path, small_disk, monkeypatch):
    """The template (an empty migrated store, larger than the disk's 128 KiB) cannot be copied whole."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    roomy = tracking.resolve(load_config(None, [f"tracking.state_dir={tmp_path / 'roomy'}"]).tracking)
    tracking.open_store(roomy)  # leaves the template
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # set by `resolve` for the process
    setup = tracking.resolve(load_config(None, [f"tracking.state_dir={small_disk}"]).tracking)
    with pytest.raises(PipelineError) as failed:
        tracking.open_store(setup)
    assert str(failed.value).startswith("no space left on device writing ") and str(failed.value).endswith(WHAT_TO_DO)
    assert not setup.sqlite_file.exists() and not list(small_disk.glob(".mlflow.db.*"))


def test_a_stage_out_of_space_fails_its_run_with_one_line(client, tmp_path, small_disk, monkeypatch):
    """SFT downloads its inputs into a state folder on a disk without room for them: the stage's error is
    the one line, its MLflow run is FAILED (owned by this process, the traceback in `rlhf.error`), and no
    partial download is left. (A store whose artifacts are not this machine's files: a local one is read
    in place.)"""
    monkeypatch.setattr(store, "in_place_folder", lambda run, name, hash_cache=None: None)
    cfg = load_config(None, [])
    outputs = {}
    for name in ("base_model", "sft_data"):
        (tmp_path / "out" / name).mkdir(parents=True)
        (tmp_path / "out" / name / "model.safetensors").write_bytes(bytes(256 << 10))
        outputs[name] = tmp_path / "out" / name
    upstream_run = client.create_run(client.exp).info.run_id
    refs = store.publish(client, upstream_run, outputs, register=())
    upstream = {"data_prep": StageOutcome("data_prep", "ran", 0.0, upstream_run, outputs=refs)}
    setup = tracking.TrackingSetup(uri=client.tracking_uri, experiment="e", state_dir=small_disk)

    outcome = execute_stage(dag.BY_NAME["sft"], cfg, setup, client.exp, upstream_run, upstream, False, RaySession(cfg.infra))

    assert outcome.status == "failed" and isinstance(outcome.error, PipelineError)
    assert str(outcome.error) == f"no space left on device writing {small_disk / 'downloads' / upstream_run / 'base_model'}{WHAT_TO_DO}"
    run = client.get_run(outcome.run_id)
    assert run.info.status == "FAILED" and run.data.tags[run_tags.TAG_STATUS] == "failed"
    assert "No space left on device" in run.data.tags["rlhf.error"]
    assert run.data.tags[run_owner.TAG_OWNER] == run_owner.owner_tags()[run_owner.TAG_OWNER]
    assert list((small_disk / "downloads" / upstream_run).iterdir()) == []


def test_a_run_the_full_store_cannot_close_stays_for_the_next_start(tmpfs, empty_store):
    """The first error is what is reported; the run stays RUNNING, owned by this process, for
    `run_owner.close_orphans` to close once the process has ended."""
    disk = tmpfs("4m")
    shutil.copyfile(empty_store, disk / "mlflow.db")
    client = MlflowClient(f"sqlite:///{disk / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e"), tags=run_owner.owner_tags()).info.run_id
    raised(lambda: (disk / "filler").write_bytes(bytes(8 << 20)))
    assert store.try_mark_failed(client, run_id, "x" * 4000) is False
    (disk / "filler").unlink()
    assert client.get_run(run_id).info.status == "RUNNING"
