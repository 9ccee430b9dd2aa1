"""A checkpoint from outside the store as a pinned input: `inputs.sft_model: /path/to/ckpt` or
`inputs.reward_model: org/name` (a hub id), as an OpenRLHF script's `--pretrain` names its SFT model.

An `import` run stands for the folder, found again by its content hash (each file's digest cached by
stamp in the state folder, so an unchanged folder is not read again); a consumer's fingerprint holds that
run, so a changed folder is a new import and its consumers rerun. On a local store the run references the
folder where it is (`rlhf.import.path`; consumers read it in place, its hash checked at use); on a tracking
server, or a store whose artifacts are not local files, the folder is copied into the run once. A hub id is
read from the hub cache, at the commit the cache's `refs/main` names (`rlhf.import.commit`), and
downloaded only when the cache lacks it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from mlflow.tracking import MlflowClient

from artifacts import run_tags, tracking
from artifacts.file_hashes import FileHashes
from configs.errors import PipelineError

TAG_KIND, KIND = "rlhf.kind", "import"
TAG_HASH, TAG_SOURCE = "rlhf.import.hash", "rlhf.import.source"
TAG_PATH = "rlhf.import.path"  # the folder a local store's import references, in place of a copy
TAG_COMMIT = "rlhf.import.commit"  # a hub id's commit, as the hub cache holds it


def is_external(uri: str) -> bool:
    """A pin that names a folder or a hub id, not an MLflow run or registered model."""
    return not uri.startswith(("runs:/", "models:/"))


def local_folder(field: str, source: str) -> Path:
    """The folder `source` names: as given when it exists, else a hub id's snapshot in the hub cache."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        return folder
    if folder.exists():
        raise PipelineError(f"{field}={source}: a file, not a checkpoint folder")
    return hub_snapshot(field, source)


def hub_snapshot(field: str, source: str) -> Path:
    """Hub id `source` from the hub cache, at the commit its `refs/main` names, without asking the hub (which
    `HF_HUB_OFFLINE=1` forbids, and which would resolve `main` again every run); downloaded only when the cache
    lacks it or holds it incomplete. `hf download <id>` moves the cache to the hub's newest commit."""
    import huggingface_hub
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, incomplete, or not a hub id: the hub decides below
        pass
    if huggingface_hub.is_offline_mode() and looks_like_hub_id(source):
        raise PipelineError(f"{field}={source}: no such folder, and not in the hub cache while HF_HUB_OFFLINE=1; "
                            f"download it once with network (`hf download {source}`) or give a checkpoint folder")
    try:
        return Path(snapshot_download(source))
    except Exception as exc:  # noqa: BLE001 - no such repo, no network, bad id: one line either way
        raise PipelineError(f"{field}={source}: no such folder, and not a hub model that can be downloaded "
                            f"({type(exc).__name__}); give a checkpoint folder or a reachable hub id") from None


def looks_like_hub_id(source: str) -> bool:
    """`org/name` or `name`, not a path that is missing."""
    return not source.startswith(("/", ".", "~")) and source.count("/") <= 1


def hub_commit(folder: Path) -> str | None:
    """The commit of a hub cache snapshot (`.../models--org--name/snapshots/<commit>`); None for a folder."""
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.name
    return None


def content_hash(folder: Path, hash_cache: Path | None = None) -> str:
    """The files' names and contents; each file's digest is kept in `hash_cache` by stamp (None: every file is
    read), so an unchanged 16 GB folder is not read twice."""
    hashes = FileHashes(hash_cache)
    h = hashlib.sha256()
    # a hub download's own `.cache/` inside the folder is not content; one above it (`~/.cache/huggingface`) is
    # where the hub cache's folders lie
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.relative_to(folder).parts):
        h.update(f"{path.relative_to(folder)}\0{hashes.digest(path)}\0".encode())
    hashes.save()
    return h.hexdigest()


def referenced(client: MlflowClient, run) -> bool:
    """A local store (no tracking server, the run's artifacts in a local folder): the folder is referenced
    in place; a copy would only double it on the same disk."""
    return not tracking.is_server(client.tracking_uri) and tracking.artifact_dir(run.info.artifact_uri) is not None


def import_checkpoint(client: MlflowClient, experiment_id: str, field: str, name: str, source: str,
                      hash_cache: Path | None = None) -> str:
    """The id of the `import` run holding `source` as artifact `name` (made now unless one exists)."""
    folder = local_folder(field, source).resolve()
    if not (folder / "config.json").is_file():
        raise PipelineError(f"{field}={source}: {folder} has no config.json; give a Hugging Face checkpoint folder")
    digest = content_hash(folder, hash_cache)
    found = client.search_runs([experiment_id], f"tags.`{TAG_KIND}` = '{KIND}' and tags.`{TAG_HASH}` = '{digest}' "
                               f"and attributes.status = 'FINISHED'", max_results=50)
    for run in found:
        if run.data.tags.get(run_tags.TAG_OUTPUTS) == name:
            if run.data.tags.get(TAG_PATH) not in (None, str(folder)):
                # the same content in another folder (moved, or another copy): this one is read from now on,
                # and the consumers of the run stay cached
                client.set_tag(run.info.run_id, TAG_PATH, str(folder))
            return run.info.run_id
    commit = hub_commit(folder)
    shown = f"{source}@{commit[:12]}" if commit else source
    run = client.create_run(experiment_id, run_name=f"import · {name} · {shown}"[:250],
                            tags={TAG_KIND: KIND, TAG_HASH: digest, TAG_SOURCE: source,
                                  **({TAG_COMMIT: commit} if commit else {})})
    run_id = run.info.run_id
    try:
        if referenced(client, run):
            client.set_tag(run_id, TAG_PATH, str(folder))
        else:
            client.log_artifacts(run_id, str(folder), name)
    except BaseException:
        client.set_terminated(run_id, "FAILED")  # never found again: only FINISHED imports are reused
        raise
    client.set_tag(run_id, run_tags.TAG_OUTPUTS, name)
    client.set_tag(run_id, run_tags.TAG_STATUS, run_tags.COMPLETE)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def checked_folder(run, hash_cache: Path | None = None) -> Path | None:
    """The folder a local store's import run references (None: the import is a copy in the store), its
    content still the one imported: a consumer never reads a folder edited since (stat-cached, ~free)."""
    where = run.data.tags.get(TAG_PATH)
    if where is None:
        return None
    folder = Path(where)
    if not folder.is_dir():
        raise PipelineError(f"{where}: gone since MLflow run {run.info.run_id} imported it; put it back, or rerun "
                            "with the pin naming where it is now")
    if content_hash(folder, hash_cache) != run.data.tags[TAG_HASH]:
        raise PipelineError(f"{where}: changed since MLflow run {run.info.run_id} imported it; rerun (the pin is "
                            "imported again) and leave the folder as it is while a run reads it")
    return folder
