"""The cache look-up: only complete, finished runs with their artifacts still present are reused."""

import shutil

import pytest

from artifacts import store, tracking
from tests.unit.conftest import stage_run


def test_a_complete_run_is_found_by_stage_and_fingerprint(client, tmp_path):
    run_id = stage_run(client, tmp_path)
    assert store.find_cached(client, client.exp, "sft", "fp1").info.run_id == run_id
    assert store.find_cached(client, client.exp, "sft", "fp2") is None
    assert store.find_cached(client, client.exp, "rm", "fp1") is None


def test_unpublished_or_unfinished_runs_are_not_cache_entries(client, tmp_path):
    stage_run(client, tmp_path, publish=False)  # killed before its outputs were logged
    stage_run(client, tmp_path, finish=False)  # still RUNNING (killed after logging)
    assert store.find_cached(client, client.exp, "sft", "fp1") is None


def test_a_run_whose_artifacts_were_deleted_is_skipped(client, tmp_path):
    older = stage_run(client, tmp_path)
    newer = stage_run(client, tmp_path)
    shutil.rmtree(tracking.artifact_dir(client.get_run(newer).info.artifact_uri) / "sft_model")
    assert store.find_cached(client, client.exp, "sft", "fp1").info.run_id == older
    shutil.rmtree(tracking.artifact_dir(client.get_run(older).info.artifact_uri) / "sft_model")
    assert store.find_cached(client, client.exp, "sft", "fp1") is None


# --- pinned inputs ---------------------------------------------------------------------------


def test_pins_resolve_runs_versions_and_aliases(client, tmp_path):
    from configs.errors import PipelineError

    run_id = stage_run(client, tmp_path)
    registered = stage_run(client, tmp_path, register=True)
    client.set_registered_model_alias("rlhf-sft", "champion", "1")
    expected = store.ArtifactRef("sft_model", registered)
    assert store.resolve_pin(client, "inputs.x", f"runs:/{run_id}/sft_model", client.exp) == store.ArtifactRef("sft_model", run_id)
    assert store.resolve_pin(client, "inputs.x", "models:/rlhf-sft/1", client.exp) == expected
    assert store.resolve_pin(client, "inputs.x", "models:/rlhf-sft@champion", client.exp) == expected
    newest = stage_run(client, tmp_path, register=True)
    assert store.resolve_pin(client, "inputs.x", "models:/rlhf-sft/latest", client.exp) == store.ArtifactRef("sft_model", newest)
    with pytest.raises(PipelineError, match=r"inputs.x=runs:/.*/dpo_model: run .* has no artifact 'dpo_model'"):
        store.resolve_pin(client, "inputs.x", f"runs:/{run_id}/dpo_model", client.exp)
    with pytest.raises(PipelineError, match=r"inputs.x=runs:/abc/sft_model: no run abc"):
        store.resolve_pin(client, "inputs.x", "runs:/abc/sft_model", client.exp)
    with pytest.raises(PipelineError, match=r"inputs.x=models:/rlhf-sft@best: no such registered model version"):
        store.resolve_pin(client, "inputs.x", "models:/rlhf-sft@best", client.exp)


def test_a_pin_takes_only_a_finished_run_with_all_its_outputs(client, tmp_path):
    """A run killed after its upload (still RUNNING) or failed after it (FAILED) is no pin's input."""
    from configs.errors import PipelineError

    running = stage_run(client, tmp_path, finish=False)
    with pytest.raises(PipelineError, match=rf"^inputs.x=runs:/{running}/sft_model: run {running} is RUNNING \(complete\), "
                                            r"not a finished run with all its outputs; pin a run that finished$"):
        store.resolve_pin(client, "inputs.x", f"runs:/{running}/sft_model", client.exp)
    failed = stage_run(client, tmp_path, register=True, finish=False)
    store.mark_failed(client, failed, "boom")
    with pytest.raises(PipelineError, match=rf"run {failed} is FAILED \(failed\), not a finished run"):
        store.resolve_pin(client, "inputs.x", f"runs:/{failed}/sft_model", client.exp)


def test_a_run_that_fails_after_registering_leaves_no_version(client, tmp_path):
    kept = stage_run(client, tmp_path, register=True)
    failed = stage_run(client, tmp_path, register=True, finish=False)  # its versions made, then the stage fails
    assert {v.run_id for v in client.search_model_versions("name = 'rlhf-sft'")} == {kept, failed}
    store.mark_failed(client, failed, "boom")
    assert [v.run_id for v in client.search_model_versions("name = 'rlhf-sft'")] == [kept]
    assert store.resolve_pin(client, "inputs.x", "models:/rlhf-sft/latest", client.exp).run_id == kept


def test_a_checkpoint_folder_pin_is_imported_once_and_again_when_it_changes(client, tmp_path):
    from configs.errors import PipelineError

    folder = tmp_path / "my-sft"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    first = store.resolve_pin(client, "inputs.sft_model", str(folder), client.exp)
    assert first.name == "sft_model"
    run = client.get_run(first.run_id)
    assert (run.info.status, run.data.tags["rlhf.kind"], run.data.tags["rlhf.import.source"]) == ("FINISHED", "import", str(folder))
    assert run.data.tags["rlhf.import.path"] == str(folder.resolve())  # a local store: referenced, not copied
    assert store.resolve_pin(client, "inputs.sft_model", str(folder), client.exp) == first  # the same content: reused
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert store.resolve_pin(client, "inputs.sft_model", str(folder), client.exp).run_id != first.run_id
    with pytest.raises(PipelineError, match=rf"^inputs.sft_model={tmp_path}/nope: no such folder, and not a hub model"):
        store.resolve_pin(client, "inputs.sft_model", str(tmp_path / "nope"), client.exp)
    (folder / "config.json").unlink()
    with pytest.raises(PipelineError, match=rf"^inputs.sft_model={folder}: {folder} has no config.json"):
        store.resolve_pin(client, "inputs.sft_model", str(folder), client.exp)
