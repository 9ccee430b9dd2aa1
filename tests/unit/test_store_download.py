"""Concurrent consumers of one upstream output each get a complete local copy."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from mlflow import MlflowClient

from artifacts import store

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)


def test_concurrent_downloads_of_one_output_all_succeed(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(exp)
    src = tmp_path / "ckpt"
    src.mkdir()
    for i in range(20):
        (src / f"shard{i}.bin").write_bytes(bytes(1000))
    client.log_artifacts(run.info.run_id, str(src), "sft_model")
    ref = store.ArtifactRef("sft_model", run.info.run_id)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: store.download(ref, tmp_path / "downloads"), range(4)))
    assert len(set(paths)) == 1
    assert sorted(p.name for p in paths[0].iterdir()) == sorted(f"shard{i}.bin" for i in range(20))
    assert [p.name for p in (tmp_path / "downloads" / run.info.run_id).iterdir()] == ["sft_model"]
