"""Stage files through the tracking store for nodes without a shared disk (`artifacts.node_files`): who
uploads which checkpoint file, the checkpoints a rerun on another node finds, and the outputs a worker
uploads, which publishing then registers without uploading again."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from artifacts import model_registry as registry
from artifacts import node_files, run_tags, store

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)
KEY = b"k" * 32  # the owner's checkpoint signing key


def test_each_rank_uploads_the_partitions_it_wrote_and_rank_0_the_rest(tmp_path):
    tag = tmp_path / "step2"
    tag.mkdir()
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                 "zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_pp_rank_12_mp_rank_00_optim_states.pt"):
        (tag / name).write_text(name)
    names = lambda rank: [p.name for p in node_files.files_to_upload(tag, rank)]  # noqa: E731
    assert names(0) == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    assert names(1) == ["zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert names(12) == ["zero_pp_rank_12_mp_rank_00_optim_states.pt"]
    assert names(2) == []
    assert len(names(None)) == 4


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the registry follows it, as in the pipeline's driver
    client = MlflowClient(uri)
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "artifacts").as_uri())
    return uri, client, experiment


def stage_run(client, experiment, fingerprint="fp1") -> str:
    return client.create_run(experiment, tags={run_tags.TAG_STAGE: "sft", run_tags.TAG_FINGERPRINT: fingerprint}).info.run_id


def save_checkpoint(work: Path, folder: str, step: int) -> Path:
    """What DeepSpeed leaves after `save_checkpoint(tag=f"step{step}")` with the older tag pruned."""
    ckpt = work / folder
    (ckpt / f"step{step}").mkdir(parents=True)
    (ckpt / f"step{step}" / "mp_rank_00_model_states.pt").write_text(f"weights at {step}")
    (ckpt / "latest").write_text(f"step{step}")
    return ckpt


def test_a_rerun_on_another_node_resumes_from_the_newest_uploaded_checkpoint(tracking, tmp_path, monkeypatch):
    uri, client, experiment = tracking
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node-a"))
    first = node_files.RunFiles(uri, stage_run(client, experiment), {}, "sft-fp1", KEY)
    work = first.work_dir()
    assert work == tmp_path / "node-a" / "work" / "sft-fp1"
    for step in (1, 2):
        ckpt = save_checkpoint(work, "checkpoints/policy", step)
        first.checkpoint_saved(ckpt, f"step{step}")
        if step == 1:
            import shutil

            shutil.rmtree(ckpt / "step1")  # pruned, as DeepSpeed's caller does
    client.set_terminated(first.run_id, "FAILED")
    other_fingerprint = stage_run(client, experiment, "fp2")
    node_files.RunFiles(uri, other_fingerprint, {}, "sft-fp2", KEY).checkpoint_saved(
        save_checkpoint(tmp_path / "node-a" / "work" / "sft-fp2", "checkpoints/policy", 9), "step9")

    rerun_id = stage_run(client, experiment)
    assert node_files.resumable_run(client, experiment, "sft", "fp1", rerun_id, KEY) == first.run_id
    assert node_files.resumable_run(client, experiment, "sft", "fp3", rerun_id, KEY) is None
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node-b"))
    rerun = node_files.RunFiles(uri, rerun_id, {}, "sft-fp1", KEY, resume_run=first.run_id)
    resumed = rerun.work_dir() / "checkpoints" / "policy"
    assert (resumed / "latest").read_text() == "step2"
    assert sorted(p.name for p in resumed.iterdir()) == ["latest", "step2"]  # the newest tag only
    assert (resumed / "step2" / "mp_rank_00_model_states.pt").read_text() == "weights at 2"
    (resumed / "step2" / "scratch").write_text("written by the rerun")
    assert rerun.work_dir() == resumed.parent.parent and (resumed / "step2" / "scratch").exists()  # prepared once

    # a checkpoint that is one file (iterative DPO's newest round) comes back the same way
    rounds = rerun.work_dir() / "rounds"
    rounds.mkdir()
    (rounds / "round3.pt").write_text("pairs of round 3")
    (rounds / "latest").write_text("round3.pt")
    rerun.checkpoint_saved(rounds, "round3.pt")
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node-c"))
    third = node_files.RunFiles(uri, stage_run(client, experiment), {}, "sft-fp1", KEY, resume_run=rerun_id)
    assert (third.work_dir() / "rounds" / "round3.pt").read_text() == "pairs of round 3"

    # a complete run's checkpoints are never resumed from
    client.set_tag(first.run_id, run_tags.TAG_STATUS, run_tags.COMPLETE)
    assert node_files.resumable_run(client, experiment, "sft", "fp1", rerun_id, KEY) is None


def test_outputs_uploaded_by_the_worker_are_published_without_a_second_upload(tracking, tmp_path, monkeypatch):
    uri, client, experiment = tracking
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node"))
    producer = stage_run(client, experiment)
    model = tmp_path / "made" / "sft_model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_text("weights")
    client.log_artifacts(producer, str(model), "sft_model")

    consumer = stage_run(client, experiment)
    files = node_files.RunFiles(uri, consumer, {"sft_model": producer}, "rm-fp1", KEY)
    fetched = files.fetch_inputs()["sft_model"]
    assert fetched == tmp_path / "node" / "downloads" / producer / "sft_model"
    assert (fetched / "model.safetensors").read_text() == "weights"

    out = files.output_dir() / "reward_model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_text("rm weights")
    files.upload_outputs({"reward_model": out})
    assert not out.exists()  # the node's copy goes once the server has it
    info = registry.CheckpointInfo(experiment_id=experiment, stage="rm", summary="a reward model", fingerprint="fp1",
                                   config={}, pipeline_run="", data={}, parents={})
    refs = store.publish(client, consumer, {"reward_model": out}, ("reward_model",), info, uploaded=True)
    assert refs["reward_model"].identity == f"runs:/{consumer}/reward_model"
    # (MLflow lists the logged model's MLmodel beside the run's own)
    listed = {Path(a.path).name for a in client.list_artifacts(consumer, "reward_model")}
    assert listed == {"MLmodel", "config.json", "model.safetensors"}
    run_folder = Path(client.get_run(consumer).info.artifact_uri.removeprefix("file://")) / "reward_model"
    assert sorted(p.name for p in run_folder.iterdir()) == ["MLmodel", "config.json", "model.safetensors"]
    version = client.get_model_version(registry.registered_name("reward_model"), "1")
    assert version.run_id == consumer


def test_a_driver_stages_actor_on_another_node_reads_its_own_copy_of_the_inputs(tracking, tmp_path, monkeypatch):
    """RL's loop hands its actors `NodeInputs`: on a node without the loop's disk, each reads the inputs it
    names from that node's download of the producing run, not by the loop's path."""
    import pickle

    from stages.dag.contract import NodeInputs

    uri, client, experiment = tracking
    producer = stage_run(client, experiment)
    model = tmp_path / "made" / "sft_model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    client.log_artifacts(producer, str(model), "sft_model")
    files = node_files.RunFiles(uri, stage_run(client, experiment, "fp2"), {"sft_model": producer, "prompts": producer}, "rl-fp2", KEY)
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node-a"))
    loop_path = files.fetch_inputs(["sft_model"])["sft_model"]
    given = pickle.loads(pickle.dumps(NodeInputs({"sft_model": str(loop_path)}, files.fetch_inputs)))  # as Ray sends it
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node-b"))  # the actor's node
    on_b = Path(given.path("sft_model"))
    assert on_b.is_relative_to(tmp_path / "node-b") and (on_b / "config.json").read_text() == "{}"
    assert on_b == tmp_path / "node-b" / "downloads" / producer / "sft_model"
    assert not (tmp_path / "node-b" / "downloads" / producer / "prompts").exists()  # only what it asked for
    assert NodeInputs({"sft_model": str(loop_path)}).path("sft_model") == str(loop_path)  # one disk: the path given


def test_a_run_another_key_signed_or_none_is_not_resumed_from(tracking, tmp_path, monkeypatch):
    """An unfinished run with the fingerprint a rerun looks for, left by someone without the owner's key (or
    with checkpoints and no manifests), is passed over: its files would be unpickled by DeepSpeed."""
    uri, client, experiment = tracking
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node-a"))
    planted = node_files.RunFiles(uri, stage_run(client, experiment), {}, "sft-fp1", b"x" * 32)
    planted.checkpoint_saved(save_checkpoint(planted.work_dir(), "checkpoints/policy", 3), "step3")
    client.set_terminated(planted.run_id, "FAILED")
    bare = stage_run(client, experiment)
    ckpt = save_checkpoint(tmp_path / "bare", "checkpoints/policy", 4)
    client.log_artifact(bare, str(ckpt / "step4" / "mp_rank_00_model_states.pt"), "work/checkpoints/policy/step4")
    client.log_artifact(bare, str(ckpt / "latest"), "work/checkpoints/policy")
    client.set_terminated(bare, "FAILED")
    assert node_files.resumable_run(client, experiment, "sft", "fp1", stage_run(client, experiment), KEY) is None
    ours = node_files.RunFiles(uri, stage_run(client, experiment), {}, "sft-fp1", KEY)
    ours.checkpoint_saved(save_checkpoint(tmp_path / "node-a" / "work" / "sft-fp1", "checkpoints/policy", 2), "step2")
    client.set_terminated(ours.run_id, "FAILED")
    assert node_files.resumable_run(client, experiment, "sft", "fp1", stage_run(client, experiment), KEY) == ours.run_id


def test_a_checkpoint_changed_after_upload_is_not_loaded(tracking, tmp_path, monkeypatch, capsys):
    uri, client, experiment = tracking
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node-a"))
    first = node_files.RunFiles(uri, stage_run(client, experiment), {}, "sft-fp1", KEY)
    first.checkpoint_saved(save_checkpoint(first.work_dir(), "checkpoints/policy", 2), "step2")
    client.set_terminated(first.run_id, "FAILED")
    stored = Path(client.get_run(first.run_id).info.artifact_uri.removeprefix("file://"))
    (stored / "work/checkpoints/policy/step2/mp_rank_00_model_states.pt").write_text("planted weights")
    monkeypatch.setenv("RLHF_NODE_DIR", str(tmp_path / "node-b"))
    rerun = node_files.RunFiles(uri, stage_run(client, experiment), {}, "sft-fp1", KEY, resume_run=first.run_id)
    assert list(rerun.work_dir().iterdir()) == []  # nothing of it kept: the stage starts over
    assert capsys.readouterr().out == (
        f"[sft] not resuming from MLflow run {first.run_id}: work/checkpoints/policy/step2/mp_rank_00_model_states.pt "
        "does not match the digest it was uploaded with; starting over\n")
