"""Stage runs in MLflow: the cache look-up by fingerprint, publishing a finished stage's outputs
(artifacts + registered models), and downloading an upstream output for a consumer.

On a local store a checkpoint exists once: a stage's output folder is moved into the store, not copied,
and a consumer reads the store's folder (or the folder an import references) in place.

A stage run is a cache entry only once it is FINISHED and tagged `rlhf.status=complete`, which
is set after every output is logged, so a failed or killed stage is never consumed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.entities import RunStatus

from artifacts import disk_full, imported, run_tags, tracking
from artifacts import model_registry as registry
from artifacts.model_registry import CheckpointInfo, model_version, register_model, registered_name
from configs.errors import PipelineError
from configs.redaction import logged, redacted

METRIC_COMPUTE_S = "time/compute_s"
METRIC_RESUMED = "resumed_from_step"  # what a stage that resumed from a checkpoint logs: the step it went on from


@dataclass(frozen=True)
class ArtifactRef:
    """A named output of a finished stage run; `identity` is what consumers fingerprint."""

    name: str
    run_id: str

    @property
    def identity(self) -> str:
        return f"runs:/{self.run_id}/{self.name}"

    @classmethod
    def parse(cls, identity: str) -> ArtifactRef:
        run_id, name = identity.removeprefix("runs:/").split("/", 1)
        return cls(name, run_id)


def artifacts_present(client: MlflowClient, run, names: list[str]) -> bool:
    """Every named output still exists in the artifact store (a deleted one means a rerun), or, for an
    import that references a folder, that folder does."""
    if (referenced := run.data.tags.get(imported.TAG_PATH)) is not None:
        return Path(referenced).is_dir()
    local = tracking.artifact_dir(run.info.artifact_uri)
    for name in names:
        if local is not None:
            path = local / name
            if not path.exists() or (path.is_dir() and not any(path.iterdir())):
                return False
        elif not client.list_artifacts(run.info.run_id, name):
            return False
    return True


def find_cached(client: MlflowClient, experiment_id: str, stage: str, fingerprint: str):
    """The newest complete run of `stage` with this fingerprint whose outputs still exist, else None."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.`{run_tags.TAG_STAGE}` = '{stage}' and tags.`{run_tags.TAG_FINGERPRINT}` = '{fingerprint}' "
            f"and tags.`{run_tags.TAG_STATUS}` = '{run_tags.COMPLETE}' and attributes.status = 'FINISHED'"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=5,
    )
    for run in runs:
        names = [n for n in run.data.tags.get(run_tags.TAG_OUTPUTS, "").split(",") if n]
        if names and artifacts_present(client, run, names):
            return run
    return None


def run_inputs(run) -> dict[str, str]:
    """The lineage a stage run recorded: `{artifact name: identity it consumed}`."""
    return {k.removeprefix(run_tags.TAG_INPUT_PREFIX): v for k, v in sorted(run.data.tags.items()) if k.startswith(run_tags.TAG_INPUT_PREFIX)}


def publish(client: MlflowClient, run_id: str, outputs: dict[str, Path], register: tuple[str, ...],
            info: CheckpointInfo | None = None, linked: tuple[list[str], object] = ([], None),
            uploaded: bool = False, scratch: Path | None = None) -> dict[str, ArtifactRef]:
    """Log each output directory under its name, register model outputs, then mark the run complete.
    With `info`, each model output is first a logged model of the run (an `MLmodel` file in its folder
    gives the registry its schema), its version is described and tagged with `info`, and the run's
    `linked` metric names (on the dataset given) are attached to it. `uploaded`: the stage's worker put
    the outputs in the run already (on a tracking server, `artifacts.node_files`): only `MLmodel` is added.
    `scratch`: the stage's own folder, removed after publishing; an output inside it is moved into a local
    store rather than copied (`log_output`)."""
    refs, models = {}, {}
    for name, path in outputs.items():
        if info is not None and name in register:
            models[name] = registry.log_checkpoint(client, info, name, run_id).model_id
            add_mlmodel(client, run_id, name, path, models[name], info, uploaded)
        if not uploaded:
            log_output(client, run_id, path, name, movable=scratch is not None and path.is_relative_to(scratch))
        refs[name] = ArtifactRef(name, run_id)
    artifact_uri = client.get_run(run_id).info.artifact_uri
    for name in register:
        if name in outputs:
            register_model(client, registered_name(name), f"{artifact_uri}/{name}", run_id, info, models.get(name))
    for model_id in models.values():
        registry.link_metrics(client, run_id, model_id, *linked)
        client.finalize_logged_model(model_id, "READY")
    client.set_tag(run_id, run_tags.TAG_OUTPUTS, ",".join(outputs))
    client.set_tag(run_id, run_tags.TAG_STATUS, run_tags.COMPLETE)
    return refs


def log_output(client: MlflowClient, run_id: str, path: Path, name: str, movable: bool) -> None:
    """Output folder `path` as the run's artifact `name`: renamed into a local store when it may be (`movable`,
    on the store's file system, no links in it that the store's copy would have followed), so a checkpoint is
    written once; copied otherwise."""
    folder = tracking.artifact_dir(client.get_run(run_id).info.artifact_uri)
    if movable and folder is not None and not (folder / name).exists() and not has_links(path):
        folder.mkdir(parents=True, exist_ok=True)
        try:
            path.rename(folder / name)
            return
        except OSError:  # another file system (EXDEV): copied
            pass
    client.log_artifacts(run_id, str(path), name)


def has_links(folder: Path) -> bool:
    """A symbolic link anywhere in `folder` (moved, it could point into a work dir about to be removed)."""
    return any(any(os.path.islink(os.path.join(root, entry)) for entry in dirs + files) for root, dirs, files in os.walk(folder))


def add_mlmodel(client: MlflowClient, run_id: str, name: str, path: Path, model_id: str, info: CheckpointInfo,
                uploaded: bool) -> None:
    """The checkpoint's `MLmodel` in its folder and in its logged model (the weights stay in the run, once)."""
    if not uploaded:
        if registry.write_mlmodel(path, name, run_id, model_id, info):
            client.log_model_artifact(model_id, str(path / "MLmodel"))
        return
    files = {Path(entry.path).name for entry in client.list_artifacts(run_id, name)}
    with tempfile.TemporaryDirectory() as folder:
        if registry.write_mlmodel(Path(folder), name, run_id, model_id, info, files):
            client.log_artifact(run_id, str(Path(folder) / "MLmodel"), name)
            client.log_model_artifact(model_id, str(Path(folder) / "MLmodel"))


def resolve_pin(client: MlflowClient, field: str, uri: str, experiment_id: str,
                hash_cache: Path | None = None) -> ArtifactRef:
    """The artifact a pinned input names: `runs:/<run_id>/<name>`, `models:/<name>/<version>` (or `/latest`)
    or `models:/<name>@<alias>` (a registered version points at the run and artifact it came from), or a
    checkpoint folder or hub id, imported into the store once (`artifacts.imported`; `hash_cache` keeps its
    files' digests). One-line errors name `field` and what is missing."""
    if imported.is_external(uri):
        name = field.removeprefix("inputs.")
        pinned = ArtifactRef(name, imported.import_checkpoint(client, experiment_id, field, name, uri, hash_cache))
    elif uri.startswith("runs:/"):
        pinned = ArtifactRef.parse(uri)
    else:
        try:
            version = model_version(client, uri.removeprefix("models:/"))
        except mlflow.exceptions.MlflowException as exc:
            raise PipelineError(f"{field}={uri}: no such registered model version ({str(exc).splitlines()[0]})") from None
        pinned = ArtifactRef(version.source.rstrip("/").rsplit("/", 1)[-1], version.run_id)
    try:
        run = client.get_run(pinned.run_id)
    except mlflow.exceptions.MlflowException:
        raise PipelineError(f"{field}={uri}: no run {pinned.run_id} in {redacted(client.tracking_uri)}") from None
    if run.info.status != "FINISHED" or run.data.tags.get(run_tags.TAG_STATUS, run_tags.COMPLETE) != run_tags.COMPLETE:
        state = run.data.tags.get(run_tags.TAG_STATUS) or run.info.status
        raise PipelineError(f"{field}={uri}: run {pinned.run_id} is {run.info.status} ({state}), not a finished run "
                            "with all its outputs; pin a run that finished")
    if not artifacts_present(client, run, [pinned.name]):
        raise PipelineError(f"{field}={uri}: run {pinned.run_id} has no artifact {pinned.name!r}")
    return pinned


def download(ref: ArtifactRef, cache_root: Path, tracking_uri: str | None = None, hash_cache: Path | None = None,
             in_place: bool = True) -> Path:
    """The local folder of an upstream output (from the store at `tracking_uri`, default this process's).

    On a local store that is the store's own folder, or the folder an import references (its hash checked,
    by stamp through `hash_cache`), read in place: a consumer never writes into it. Otherwise (or with
    `in_place` False: a node's own copy, `artifacts.node_files`) a copy kept per run under `cache_root`, so
    repeated consumers copy once; each caller downloads into its own temp dir and renames it into place, so
    stages that start at once (and other pipeline processes) never see a partial copy; the first rename wins.
    """
    target = cache_root / ref.run_id / ref.name
    if target.exists() and not target.is_symlink():  # a copy (a link is `linked`'s: the folder is checked below)
        return target
    run = MlflowClient(tracking_uri).get_run(ref.run_id)
    if in_place and (found := in_place_folder(run, ref.name, hash_cache)) is not None:
        return found
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{ref.name}.", dir=target.parent))
    try:
        # from the run's artifact location: through `runs:/` MLflow replaces the reason a copy failed
        # (a full disk) with "please ensure that the path is correct"
        with disk_full.reported(target):
            mlflow.artifacts.download_artifacts(artifact_uri=f"{run.info.artifact_uri}/{ref.name}", dst_path=str(tmp),
                                                tracking_uri=tracking_uri)
        try:
            (tmp / ref.name).rename(target)
        except OSError:
            if not target.exists():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def in_place_folder(run, name: str, hash_cache: Path | None = None) -> Path | None:
    """Artifact `name` of `run` where it lies on this machine (an import's referenced folder, or the folder
    in a local artifact store); None when it is not a local folder here."""
    if (referenced := imported.checked_folder(run, hash_cache)) is not None:
        return referenced
    store = tracking.artifact_dir(run.info.artifact_uri)
    return store / name if store is not None and (store / name).is_dir() else None


def linked(ref: ArtifactRef, folder: Path, cache_root: Path) -> Path:
    """`folder`'s place under `cache_root`, as a download's: the folder itself when it is a downloaded copy,
    else a link to it, for what writes beside its input (a merged adapter) and must not write into the store."""
    target = cache_root / ref.run_id / ref.name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{ref.name}.{os.getpid()}.{threading.get_ident()}.link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(folder, target_is_directory=True)
    tmp.replace(target)  # atomic: a concurrent consumer sees the link or none
    return target


def mark_failed(client: MlflowClient, run_id: str, error: str, interrupted: bool = False) -> None:
    """A stage run that ended without its outputs: FAILED, or KILLED when the user stopped the run, and no
    model version of it left registered (`publish` registers before it marks the run complete: a failure
    in between would leave `models:/rlhf-...` versions of a run that never finished)."""
    client.set_tag(run_id, run_tags.TAG_STATUS, "interrupted" if interrupted else "failed")
    client.set_tag(run_id, "rlhf.error", logged(error, 4000))
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.KILLED if interrupted else RunStatus.FAILED))
    for version in client.search_model_versions(f"run_id = '{run_id}'"):
        client.delete_model_version(version.name, version.version)


def try_mark_failed(client: MlflowClient, run_id: str, error: str, interrupted: bool = False) -> bool:
    """`mark_failed`, unless the store cannot take it (a full disk): on a failure path the first error
    is the one to report, and the run left RUNNING is closed by the next start (`run_owner`)."""
    try:
        mark_failed(client, run_id, error, interrupted)
    except Exception:  # noqa: BLE001 - best effort, see above
        return False
    return True
