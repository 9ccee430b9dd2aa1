"""A stage's files on a tracking server, for stage work on nodes that share no disk with the driver.

With `tracking.uri=http(s)://...` a stage worker reads nothing by a path the driver gave it: each node
downloads the inputs its ranks read into a folder of its own (`RLHF_NODE_DIR`, default
`<tmp>/rlhf-node-<uid>`, 0700), the stage writes its work and outputs there, and rank 0 uploads the outputs to the
stage's MLflow run through the server. Resumable checkpoints go up to the run as they are written
(under `work/`, mirroring the work dir), so a rerun of the stage on any node starts from the newest
checkpoint an earlier run of the same fingerprint left.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from artifacts import checkpoint_digests, file_hashes, run_tags, store
from artifacts.private_dirs import private_dir

WORK = "work"  # a run's artifact folder of resumable checkpoints, mirroring its work dir
LATEST = "latest"  # DeepSpeed's pointer to a checkpoint folder's newest complete tag: uploaded last
RANK_FILE = re.compile(r"zero_pp_rank_(\d+)_")


def node_dir() -> Path:
    """This node's folder for stage files (`RLHF_NODE_DIR`, set where a node starts)."""
    configured = os.environ.get("RLHF_NODE_DIR")
    return Path(configured) if configured else private_dir("rlhf-node")


def owner(name: str) -> int:
    """The rank that writes a checkpoint file: ZeRO's per-rank partitions name theirs; rank 0 writes the rest."""
    found = RANK_FILE.search(name)
    return int(found.group(1)) if found else 0


def files_to_upload(tag: Path, rank: int | None) -> list[Path]:
    """The files of one checkpoint tag (a folder, or one file) that `rank` wrote (None: all of them, for a
    single process)."""
    files = [tag] if tag.is_file() else sorted(p for p in tag.rglob("*") if p.is_file())
    return [p for p in files if rank is None or owner(p.name) == rank]


@dataclass(frozen=True)
class RunFiles:
    """What a stage worker needs to find its inputs and leave its files on the tracking server."""

    tracking_uri: str
    run_id: str
    inputs: dict[str, str]  # artifact name -> the run that produced it
    work_name: str  # "<stage>-<fingerprint>"
    key: bytes = field(repr=False)  # the owner's checkpoint signing key (artifacts.checkpoint_digests)
    resume_run: str | None = None  # an earlier run of this stage and fingerprint that uploaded checkpoints
    # the stage takes whole models: the worker merges a LoRA adapter input on the node (runtime.worker_pool.whole_models)
    merge_adapters: bool = False

    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(self.tracking_uri)

    @property
    def local_work_dir(self) -> Path:
        return node_dir() / "work" / self.work_name

    def fetch_inputs(self, names: list[str] | None = None) -> dict[str, Path]:
        """The inputs (or the named ones), downloaded to this node once per producing run (ranks and actors on
        one node share the copy). Always a copy of the node's own, never the store's folder in place: no disk is
        assumed shared, and a LoRA adapter input is merged beside it (`runtime.worker_pool.whole_models`)."""
        return {name: store.download(store.ArtifactRef(name, run), node_dir() / "downloads", self.tracking_uri,
                                     in_place=False)
                for name, run in self.inputs.items() if names is None or name in names}

    def work_dir(self) -> Path:
        """This node's work dir for the run, holding `resume_run`'s checkpoints: made once per node and run
        (the first rank to come downloads them while the others wait on the lock)."""
        work = self.local_work_dir
        work.parent.mkdir(parents=True, exist_ok=True)
        with open(work.parent / f"{self.work_name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            made = work.parent / f"{self.work_name}.{self.run_id}"
            if not made.exists():
                shutil.rmtree(work, ignore_errors=True)  # an earlier run's, on this node: the server's copy decides
                work.mkdir(parents=True)
                if self.resume_run is not None:
                    problem = download_checkpoints(self.client(), self.resume_run, work, self.key)
                    if problem:  # changed since it was uploaded: nothing of it is loaded
                        print(f"[{self.work_name.split('-')[0]}] not resuming from MLflow run {self.resume_run}: "
                              f"{problem}; starting over", flush=True)
                        shutil.rmtree(work)
                        work.mkdir()
                made.touch()
        return work

    def output_dir(self) -> Path:
        path = node_dir() / "output" / self.run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def checkpoint_saved(self, ckpt_dir: Path, tag: str, rank: int | None = None) -> None:
        """Upload checkpoint `tag` (a folder or a file) of `ckpt_dir` (in the work dir): each rank its own
        files, then, once every rank's are up, rank 0 the `latest` pointer naming `tag`, so the server
        never names a tag it lacks."""
        client = self.client()
        where = f"{WORK}/{ckpt_dir.relative_to(self.local_work_dir).as_posix()}"
        digests = {}
        for path in files_to_upload(ckpt_dir / tag, rank):
            below = path.parent.relative_to(ckpt_dir).as_posix()
            client.log_artifact(self.run_id, str(path), where if below == "." else f"{where}/{below}")
            digests[path.relative_to(ckpt_dir).as_posix()] = file_hashes.sha256(path)
        if digests:  # what this rank wrote, signed: a rerun loads it only unchanged, and only from its owner's runs
            with tempfile.TemporaryDirectory() as staging:
                signed = Path(staging) / checkpoint_digests.manifest_name(tag, rank)
                signed.write_text(checkpoint_digests.manifest(self.key, self.run_id, where, tag, digests))
                client.log_artifact(self.run_id, str(signed), where)
        if rank is not None:
            import torch.distributed as dist

            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.barrier()
        if rank in (None, 0) and (ckpt_dir / LATEST).is_file():
            client.log_artifact(self.run_id, str(ckpt_dir / LATEST), where)

    def upload_outputs(self, outputs: dict[str, Path]) -> None:
        """Rank 0: each output folder to the run, under its name; then this node's copies go."""
        client = self.client()
        for name, path in outputs.items():
            client.log_artifacts(self.run_id, str(path), name)
        shutil.rmtree(self.output_dir(), ignore_errors=True)

    def finished(self) -> None:
        """The stage's outputs are up: its checkpoints on this node are not needed again."""
        shutil.rmtree(self.local_work_dir, ignore_errors=True)
        (self.local_work_dir.parent / f"{self.work_name}.{self.run_id}").unlink(missing_ok=True)


def resumable_run(client, experiment_id: str, stage: str, fingerprint: str, exclude: str, key: bytes) -> str | None:
    """The newest other run of `stage` with this fingerprint that ended without its outputs and left
    checkpoints on the server, signed with the owner's `key` (a run anyone else left is passed over); None when
    there is none."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{run_tags.TAG_STAGE}` = '{stage}' and tags.`{run_tags.TAG_FINGERPRINT}` = '{fingerprint}'",
        order_by=["attributes.start_time DESC"],
        max_results=20,
    )
    for run in runs:
        if run.info.run_id != exclude and run.data.tags.get(run_tags.TAG_STATUS) != run_tags.COMPLETE \
                and client.list_artifacts(run.info.run_id, WORK) and signed_by(client, run.info.run_id, key):
            return run.info.run_id
    return None


def newest_tags(client, run_id: str) -> dict[str, str]:
    """Each checkpoint folder of the run and the tag its `latest` pointer names."""
    tags = {}
    for folder in checkpoint_folders(client, run_id):
        with tempfile.TemporaryDirectory() as staging:
            tags[folder] = Path(client.download_artifacts(run_id, f"{folder}/{LATEST}", staging)).read_text().strip()
    return tags


def manifest_files(client, run_id: str, folder: str, tag: str, key: bytes) -> dict[str, str] | None:
    """The files of `tag` in `folder` and their digests, as the run's signed manifests list them; None when a
    manifest is missing or not signed with `key`."""
    names = [e.path for e in client.list_artifacts(run_id, folder)
             if not e.is_dir and checkpoint_digests.is_manifest_of(e.path.rsplit("/", 1)[-1], tag)]
    with tempfile.TemporaryDirectory() as staging:
        texts = [Path(client.download_artifacts(run_id, name, staging)).read_text() for name in names]
    return checkpoint_digests.verified_files(key, run_id, folder, tag, texts)


def signed_by(client, run_id: str, key: bytes) -> bool:
    """Every checkpoint folder's newest tag has manifests signed with `key`."""
    tags = newest_tags(client, run_id)
    return bool(tags) and all(manifest_files(client, run_id, f, t, key) is not None for f, t in tags.items())


def checkpoint_folders(client, run_id: str, path: str = WORK) -> list[str]:
    """The artifact folders under `path` of a run that hold a `latest` pointer (their subfolders are tags)."""
    entries = client.list_artifacts(run_id, path)
    if any(not e.is_dir and e.path.rsplit("/", 1)[-1] == LATEST for e in entries):
        return [path]
    return [found for e in entries if e.is_dir for found in checkpoint_folders(client, run_id, e.path)]


def download_checkpoints(client, run_id: str, work: Path, key: bytes) -> str:
    """The newest tag of each checkpoint folder `run_id` uploaded, into the work dir where it was written
    (its `latest` pointer last, as DeepSpeed writes it), each file checked against the digest its signed
    manifest gives. '' when all came down unchanged, else what did not (the work dir then holds files no
    stage may load)."""
    for folder, tag in newest_tags(client, run_id).items():
        listed = manifest_files(client, run_id, folder, tag, key)
        if listed is None:
            return f"{folder}/{tag} has no manifest signed by this pipeline's owner"
        local = work / PurePosixPath(folder).relative_to(WORK)
        local.mkdir(parents=True, exist_ok=True)
        client.download_artifacts(run_id, f"{folder}/{tag}", str(local))
        came = local / tag
        got = {p.relative_to(local).as_posix() for p in ([came] if came.is_file() else came.rglob("*")) if p.is_file()}
        if got != set(listed):
            return f"{folder}/{tag} holds other files than its manifest lists"
        for name, digest in listed.items():
            if file_hashes.sha256(local / name) != digest:
                return f"{folder}/{name} does not match the digest it was uploaded with"
        (local / LATEST).write_text(tag)
    return ""
