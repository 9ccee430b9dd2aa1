"""Each target stage rerun alone in a scratch store: `rlhf run --only STAGE` as the flow runs it, its config the
original's, its inputs pinned to stand-ins for the very artifacts the original consumed (import runs in the
scratch store that reference the original's folders in place, as a pinned checkpoint folder is), so each stage is
checked on its own whatever an upstream rerun gives. Nothing is written to the user's store."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import RunStatus

from artifacts import imported, run_tags, store, tracking
from configs.errors import PipelineError, first_line
from configs.schema import TrackingConfig
from flows.stage_task import HASH_CACHE
from flows.verify import contents
from flows.verify.compare import Verdict, verdict
from flows.verify.targets import Target, stage_config

STORE = "store"  # the scratch store's state folder, in the scratch folder
INPUTS, ORIGINALS = "inputs", "originals"  # copies of a tracking server's artifacts: inputs, and outputs to compare


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Environment variables set for the block, as they were after it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def scratch_uri(scratch: Path) -> str:
    return f"sqlite:///{scratch / STORE / 'mlflow.db'}"


class ScratchStore:
    """The scratch folder's MLflow store, with a stand-in run per input artifact of the original store. Made, and
    used, while MLFLOW_TRACKING_URI and MLFLOW_REGISTRY_URI name it (`scratch_uri`): every MLflow client the flow
    opens writes here, whatever the user's environment names."""

    def __init__(self, scratch: Path, original: MlflowClient, tracking_cfg: TrackingConfig):
        self.scratch, self.original = scratch, original
        self.state_dir = scratch / STORE
        self.uri = scratch_uri(scratch)
        self.tracking = tracking_cfg.model_copy(update={"state_dir": str(self.state_dir), "uri": self.uri, "system_metrics": False})
        self.setup = tracking.resolve(self.tracking)
        self.client = tracking.open_store(self.setup)
        self.experiment_id = tracking.experiment_id(self.client, self.setup)
        self.stand_ins: dict[str, str] = {}  # original identity -> stand-in identity

    @property
    def overrides(self) -> list[str]:
        """What points a run at this store (the environment's MLFLOW_TRACKING_URI is set too: it comes first)."""
        return [f"tracking.state_dir={self.state_dir}", f"tracking.uri={self.uri}", "tracking.system_metrics=false"]

    def stand_in(self, identity: str) -> str:
        """`runs:/<stand-in>/<name>` for input `identity` of the original store: an import run here that references
        the original's folder where it lies (a tracking server's artifact: a copy in the scratch folder)."""
        if identity in self.stand_ins:
            return self.stand_ins[identity]
        ref = store.ArtifactRef.parse(identity)
        hashes = self.state_dir / HASH_CACHE
        folder = store.in_place_folder(self.original.get_run(ref.run_id), ref.name, hashes) or \
            store.download(ref, self.scratch / INPUTS, tracking_uri=self.original.tracking_uri, in_place=False)
        run_id = self.client.create_run(self.experiment_id, run_name=f"original · {ref.name}", tags={
            imported.TAG_KIND: imported.KIND, imported.TAG_HASH: imported.content_hash(folder, hashes),
            imported.TAG_SOURCE: identity, imported.TAG_PATH: str(folder),
            run_tags.TAG_OUTPUTS: ref.name, run_tags.TAG_STATUS: run_tags.COMPLETE}).info.run_id
        self.client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
        self.stand_ins[identity] = f"runs:/{run_id}/{ref.name}"
        return self.stand_ins[identity]

    def stage_run(self, stage: str):
        """The complete run of `stage` a rerun made here, or None."""
        found = self.client.search_runs([self.experiment_id], f"tags.`{run_tags.TAG_STAGE}` = '{stage}' and "
                                        f"tags.`{run_tags.TAG_STATUS}` = '{run_tags.COMPLETE}'", max_results=1)
        return found[0] if found else None


def rerun(target: Target, scratch: ScratchStore) -> Verdict:
    """Run the target's stage alone in the scratch store and compare what it made with the original run."""
    from flows.pipeline import rlhf_pipeline

    pins = [f"inputs.{name}={scratch.stand_in(identity)}" for name, identity in target.inputs.items()]
    overrides = [*target.overrides, *scratch.overrides, *pins]
    print(f"[verify] {target.stage}: rerunning MLflow run {target.run.info.run_id} in {scratch.state_dir}", flush=True)
    try:
        rlhf_pipeline(config=target.config, overrides=overrides, only=[target.stage])
    except PipelineError as error:
        return Verdict(target.stage, failed=first_line(error), note=target.note)
    made = scratch.stage_run(target.stage)
    if made is None:
        return Verdict(target.stage, failed="the rerun made no complete run of it", note=target.note)
    original_files = contents.output_digests(scratch.original, target.run, scratch.scratch / ORIGINALS)
    return verdict(target.stage, original_files, contents.output_digests(scratch.client, made, scratch.scratch / ORIGINALS),
                   contents.histories(scratch.original, target.run), contents.histories(scratch.client, made), target.note)


def tracking_of(target: Target) -> TrackingConfig:
    return stage_config(target.config, list(target.overrides)).tracking
