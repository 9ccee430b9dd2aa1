"""A checkpoint from outside the store as a pinned input: `inputs.sft_model: /path/to/ckpt` or
`inputs.reward_model: org/name` (a hub id), as an OpenRLHF script's `--pretrain` names its SFT model.

The folder (a hub id is downloaded first) is logged once as the artifact of an `import` run, found again by
its content hash; the stages then read it as they read any stage's output, and a consumer's fingerprint
holds that run, so a changed folder is a new import and its consumers rerun."""

from __future__ import annotations

import hashlib
from pathlib import Path

from mlflow.tracking import MlflowClient

from artifacts.file_hashes import FileHashes
from artifacts.store import COMPLETE, TAG_OUTPUTS, TAG_STATUS
from configs.errors import PipelineError

TAG_KIND, KIND = "rlhf.kind", "import"
TAG_HASH, TAG_SOURCE = "rlhf.import.hash", "rlhf.import.source"


def is_external(uri: str) -> bool:
    """A pin that names a folder or a hub id, not an MLflow run or registered model."""
    return not uri.startswith(("runs:/", "models:/"))


def local_folder(field: str, source: str) -> Path:
    """The folder `source` names: as given when it exists, else a hub id downloaded (or found in the hub cache)."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        return folder
    if folder.exists():
        raise PipelineError(f"{field}={source}: a file, not a checkpoint folder")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source))
    except Exception as exc:  # noqa: BLE001 - no such repo, no network, bad id: one line either way
        raise PipelineError(f"{field}={source}: no such folder, and not a hub model that can be downloaded "
                            f"({type(exc).__name__}); give a checkpoint folder or a reachable hub id") from None


def content_hash(folder: Path) -> str:
    """The files' names and contents (each file's digest cached by stamp, so an unchanged 16 GB folder is
    not read twice)."""
    hashes = FileHashes(None)
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts):
        h.update(f"{path.relative_to(folder)}\0{hashes.digest(path)}\0".encode())
    return h.hexdigest()


def import_checkpoint(client: MlflowClient, experiment_id: str, field: str, name: str, source: str) -> str:
    """The id of the `import` run holding `source` as artifact `name` (made now unless one exists)."""
    folder = local_folder(field, source)
    if not (folder / "config.json").is_file():
        raise PipelineError(f"{field}={source}: {folder} has no config.json; give a Hugging Face checkpoint folder")
    digest = content_hash(folder)
    found = client.search_runs([experiment_id], f"tags.`{TAG_KIND}` = '{KIND}' and tags.`{TAG_HASH}` = '{digest}' "
                               f"and attributes.status = 'FINISHED'", max_results=50)
    for run in found:
        if run.data.tags.get(TAG_OUTPUTS) == name:
            return run.info.run_id
    run = client.create_run(experiment_id, run_name=f"import · {name} · {source}"[:250],
                            tags={TAG_KIND: KIND, TAG_HASH: digest, TAG_SOURCE: source})
    run_id = run.info.run_id
    try:
        client.log_artifacts(run_id, str(folder), name)
    except BaseException:
        client.set_terminated(run_id, "FAILED")  # never found again: only FINISHED imports are reused
        raise
    client.set_tag(run_id, TAG_OUTPUTS, name)
    client.set_tag(run_id, TAG_STATUS, COMPLETE)
    client.set_terminated(run_id, "FINISHED")
    return run_id
