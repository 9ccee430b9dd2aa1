"""Consumers of an upstream output: on a local store they read the store's folder in place (a stage's outputs
are moved into it, not copied); otherwise concurrent consumers each get a complete local copy."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow import MlflowClient

from artifacts import store, tracking

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
        # copies, as each node of a tracking server makes its own (`artifacts.node_files`)
        paths = list(pool.map(lambda _: store.download(ref, tmp_path / "downloads", in_place=False), range(4)))
    assert len(set(paths)) == 1
    assert sorted(p.name for p in paths[0].iterdir()) == sorted(f"shard{i}.bin" for i in range(20))
    assert [p.name for p in (tmp_path / "downloads" / run.info.run_id).iterdir()] == ["sft_model"]


# --- one copy on one machine: a local store's folders are read in place, outputs moved in -------------


@pytest.fixture
def local_store(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri)
    return client, client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())


def logged_checkpoint(client, experiment, tmp_path) -> store.ArtifactRef:
    src = tmp_path / "made" / "sft_model"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(bytes(4096))
    run = client.create_run(experiment).info.run_id
    client.log_artifacts(run, str(src), "sft_model")
    return store.ArtifactRef("sft_model", run)


def test_a_local_store_download_is_the_stores_folder_and_a_nodes_download_a_copy(local_store, tmp_path):
    client, experiment = local_store
    ref = logged_checkpoint(client, experiment, tmp_path)
    in_store = tracking.artifact_dir(client.get_run(ref.run_id).info.artifact_uri) / "sft_model"
    assert store.download(ref, tmp_path / "downloads") == in_store
    assert not (tmp_path / "downloads").exists()  # nothing copied
    node_copy = store.download(ref, tmp_path / "node", in_place=False)  # artifacts.node_files: a node's own
    assert node_copy == tmp_path / "node" / ref.run_id / "sft_model"
    assert (node_copy / "model.safetensors").stat().st_ino != (in_store / "model.safetensors").stat().st_ino


def test_what_writes_beside_an_input_read_in_place_writes_in_the_downloads_folder(local_store, tmp_path):
    """`lora_merge.materialize` makes a merged adapter beside the folder it is given: given the input's
    place in the downloads folder (a link), it never writes into the store."""
    client, experiment = local_store
    ref = logged_checkpoint(client, experiment, tmp_path)
    in_store = store.download(ref, tmp_path / "downloads")
    link = store.linked(ref, in_store, tmp_path / "downloads")
    assert link == tmp_path / "downloads" / ref.run_id / "sft_model" and link.resolve() == in_store
    assert (link / "config.json").read_text() == "{}"
    assert link.with_name("sft_model.merged").parent == tmp_path / "downloads" / ref.run_id
    assert store.linked(ref, in_store, tmp_path / "downloads") == link  # made once
    assert store.download(ref, tmp_path / "downloads") == in_store  # a consumer still reads the store's folder


def checkpoint_output(folder: Path) -> dict[str, int]:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(bytes(1 << 20))
    return {p.name: p.stat().st_ino for p in folder.iterdir()}


def test_a_stage_output_is_moved_into_a_local_store_not_copied(local_store, tmp_path):
    client, experiment = local_store
    run = client.create_run(experiment).info.run_id
    scratch = tmp_path / "work" / "output"
    written = checkpoint_output(scratch / "reward_model")
    store.publish(client, run, {"reward_model": scratch / "reward_model"}, register=(), scratch=scratch)
    in_store = tracking.artifact_dir(client.get_run(run).info.artifact_uri) / "reward_model"
    assert {p.name: p.stat().st_ino for p in in_store.iterdir()} == written  # the same files: no byte written twice
    assert not (scratch / "reward_model").exists()


def test_an_output_outside_the_stages_folder_or_holding_links_is_copied(local_store, tmp_path):
    client, experiment = local_store
    scratch = tmp_path / "work" / "output"
    elsewhere = tmp_path / "elsewhere" / "reward_model"
    checkpoint_output(elsewhere)
    linking = scratch / "policy"
    checkpoint_output(linking)
    (linking / "tokenizer.json").symlink_to(elsewhere / "config.json")  # the store's copy holds the file, not the link
    run = client.create_run(experiment).info.run_id
    store.publish(client, run, {"reward_model": elsewhere, "policy": linking}, register=(), scratch=scratch)
    in_store = tracking.artifact_dir(client.get_run(run).info.artifact_uri)
    assert elsewhere.is_dir() and linking.is_dir()
    assert not (in_store / "policy" / "tokenizer.json").is_symlink()
    assert sorted(p.name for p in (in_store / "reward_model").iterdir()) == ["config.json", "model.safetensors"]
