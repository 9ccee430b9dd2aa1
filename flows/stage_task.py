"""Running one stage inside the flow: fingerprint, cache look-up, MLflow run, Ray launch, publish.

The MLflow store is the cache: a stage whose fingerprint matches a complete run is not run again.
"""

from __future__ import annotations

import fcntl
import shutil
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Param, RunStatus
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

import configs
from artifacts import checkpoint_digests, datasets, disk_full, node_files, run_owner, run_tags, store
from artifacts import fingerprint as fp
from artifacts import model_registry as registry
from artifacts.metrics import MlflowMetrics
from artifacts.tracking import TrackingSetup
from configs.errors import PipelineError, first_line
from configs.loader import flatten
from configs.redaction import logged
from configs.schema import PipelineConfig
from flows import eval_report, eval_reuse, run_views
from flows.services.ray_cluster import RaySession
from stages.common import checkpoint_paths
from stages.dag import declaration as dag
from stages.dag.contract import StageContext

LOCK_POLL_S = 1.0  # how often a stage waiting for another run's lock looks again (and at Ctrl-C)


@dataclass
class StageOutcome:
    stage: str
    status: str  # ran | cached | skipped | failed | interrupted
    seconds: float
    run_id: str | None = None
    fingerprint: str | None = None
    outputs: dict[str, store.ArtifactRef] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    error: BaseException | None = None
    inputs: dict[str, str] = field(default_factory=dict)  # lineage: artifact name -> identity it consumed

    @property
    def key_metric(self) -> tuple[str, float] | None:
        name = dag.BY_NAME[self.stage].key_metric
        return (name, self.metrics[name]) if name in self.metrics else None


HASH_CACHE = "file_hashes.json"  # in the state folder


class NothingToDo(Exception):
    """An input is an optional output its producer did not make (e.g. no PRM data): skip the stage."""


def resolve_inputs(spec: dag.StageSpec, upstream: dict[str, StageOutcome], cfg: PipelineConfig,
                   pins: dict[str, store.ArtifactRef] | None = None) -> dict[str, store.ArtifactRef]:
    """The artifacts the stage consumes: its upstream stages' outputs, or the pinned ones (`inputs.*`)."""
    if not spec.asked_for(cfg):
        raise NothingToDo("not asked for by the config")
    available = {name: ref for outcome in upstream.values() for name, ref in outcome.outputs.items()} | (pins or {})
    wanted = [name for name in spec.wanted_inputs(cfg) if name in available or name not in spec.optional_inputs]
    missing = [name for name in wanted if name not in available]
    skipped = [name for name in missing if upstream.get(dag.producer(name).name) is not None
               and upstream[dag.producer(name).name].status == "skipped"]
    optional = [name for name in missing if name in dag.producer(name).optional_outputs]
    if missing and set(missing) <= set(optional) | set(skipped):
        raise NothingToDo(f"no {', '.join(missing)} in this pipeline's data")
    if missing:
        producers = ", ".join(f"{m} (from {dag.producer(m).name})" for m in missing)
        raise PipelineError(f"stage {spec.name} needs {producers}, which upstream did not produce")
    return {name: available[name] for name in wanted}


def stage_fingerprint(spec: dag.StageSpec, cfg: PipelineConfig, inputs: dict[str, store.ArtifactRef],
                      state_dir: Path | None = None) -> str:
    """`state_dir` keeps the local files' hashes between runs (`file_hashes.json`); None hashes them anew."""
    identities = {name: ref.identity for name, ref in inputs.items()}
    # files the config names (datasets, a local model, a reward file) count by content, wherever they lie
    sources = fp.config_subset(cfg, spec.wanted_config(spec.local_sources, cfg))
    hash_cache = state_dir / HASH_CACHE if state_dir is not None else None
    identities.update(fp.local_sources(sources, Path(configs.__file__).parent, hash_cache))
    return fp.fingerprint(spec.name, fp.config_subset(cfg, spec.wanted_config(spec.config_keys, cfg)), identities,
                          fp.code_version(spec.module))


def execute_stage(
    spec: dag.StageSpec,
    cfg: PipelineConfig,
    setup: TrackingSetup,
    experiment_id: str,
    parent_run_id: str,
    upstream: dict[str, StageOutcome],
    force: bool,
    ray_session: RaySession,
    reuse_only: bool = False,
    pins: dict[str, store.ArtifactRef] | None = None,
    label: tuple[str, str] = ("", ""),
) -> StageOutcome:
    """Reuse a cached run or run the stage on Ray (`reuse_only`: a cache miss is an error); never
    raises (a failure is an outcome). `label`: the pipeline run's config and overrides, for run names."""
    started = time.monotonic()
    client = MlflowClient(setup.uri)
    run_id = fingerprint = work_dir = None
    try:
        if ray_session.stopping.is_set():  # Ctrl-C came before this stage's turn
            raise KeyboardInterrupt("the run is being stopped")
        try:
            inputs = resolve_inputs(spec, upstream, cfg, pins)
        except NothingToDo as reason:
            print(f"[{spec.name}] skipped: {reason}", flush=True)
            return StageOutcome(spec.name, "skipped", time.monotonic() - started)
        fingerprint = stage_fingerprint(spec, cfg, inputs, setup.state_dir)

        def reuse() -> StageOutcome | None:
            cached = None if force else store.find_cached(client, experiment_id, spec.name, fingerprint)
            if cached is None:
                return None
            print(f"[{spec.name}] cached: reusing MLflow run {cached.info.run_id}", flush=True)
            run_views.record_reuse(client, experiment_id, parent_run_id, spec.name, cached)
            return StageOutcome(
                spec.name, "cached", time.monotonic() - started, cached.info.run_id, fingerprint,
                outputs={n: store.ArtifactRef(n, cached.info.run_id) for n in cached.data.tags[run_tags.TAG_OUTPUTS].split(",")},
                metrics=dict(cached.data.metrics), inputs=store.run_inputs(cached),
            )

        if (outcome := reuse()) is not None:
            return outcome
        if reuse_only:
            raise PipelineError(f"stage {spec.name}: no finished run matches this config (fingerprint {fingerprint}), and "
                                f"--only reuses the stages it needs; run the pipeline first or add {spec.name} to --only")
        work_dir = setup.state_dir / "work" / f"{spec.name}-{fingerprint}"
        with work_dir_lock(work_dir, spec.name, ray_session.stopping):
            if (outcome := reuse()) is not None:  # another pipeline run finished it while we waited
                return outcome
            identities = {n: ref.identity for n, ref in inputs.items()}
            run_id = client.create_run(
                experiment_id,
                run_name=run_views.stage_run_name(spec.name, label),
                tags={
                    MLFLOW_RUN_NOTE: run_views.stage_description(spec, experiment_id, parent_run_id, fingerprint, identities),
                    run_tags.TAG_PARENT: parent_run_id,
                    run_tags.TAG_STAGE: spec.name,
                    run_tags.TAG_FINGERPRINT: fingerprint,
                    run_tags.TAG_STATUS: "running",
                    **{run_tags.TAG_INPUT_PREFIX + n: ref.identity for n, ref in inputs.items()},
                    **run_owner.owner_tags(),
                },
            ).info.run_id
            refs, metrics = run_and_publish(spec, cfg, setup, client, run_id, fingerprint, inputs, work_dir, ray_session,
                                            experiment_id, parent_run_id)
        return StageOutcome(spec.name, "ran", time.monotonic() - started, run_id, fingerprint, refs, metrics,
                            inputs={n: ref.identity for n, ref in inputs.items()})
    except BaseException as exc:  # noqa: BLE001 - reported as the stage's outcome, re-raised by the flow
        error = unwrap(exc)
        if ray_session.stopping.is_set():  # whatever the stopped work raised (Ray gone, KeyboardInterrupt)
            if run_id is not None:
                print(f"[{spec.name}] interrupted: MLflow run {run_id} marked KILLED", flush=True)
                store.try_mark_failed(client, run_id, "".join(traceback.format_exception(error)), interrupted=True)
            return StageOutcome(spec.name, "interrupted", time.monotonic() - started, run_id, fingerprint,
                                error=KeyboardInterrupt())
        trace = "".join(traceback.format_exception(error))
        if (full := disk_full.no_space(error, work_dir or setup.state_dir, setup.sqlite_file)) is not None:
            full.__cause__, error = error, full
        print(f"[{spec.name}] failed: {type(error).__name__}: {first_line(error)}", flush=True)
        if run_id is not None:
            store.try_mark_failed(client, run_id, trace)  # the store may be what is full
        return StageOutcome(spec.name, "failed", time.monotonic() - started, run_id, fingerprint, error=error)


def run_and_publish(spec: dag.StageSpec, cfg: PipelineConfig, setup: TrackingSetup, client: MlflowClient, run_id: str,
                    fingerprint: str, inputs: dict[str, store.ArtifactRef], work_dir: Path, ray_session: RaySession,
                    experiment_id: str, parent_run_id: str) -> tuple[dict[str, store.ArtifactRef], dict[str, float]]:
    """Run the stage on Ray in its work dir (where a rerun finds its checkpoints) and publish its outputs:
    the datasets it read as the run's inputs, its checkpoints as logged models (registered where the DAG
    says) recording where they came from."""
    params = flatten(fp.config_subset(cfg, spec.wanted_config(spec.config_keys, cfg)))
    client.log_batch(run_id, params=[Param(k, logged(v)) for k, v in params.items()])
    print(f"[{spec.name}] running (MLflow run {run_id}, fingerprint {fingerprint})", flush=True)

    # on a tracking server the stage's workers fetch their own inputs (`node_files`); here, only the
    # datasets' manifests, for their digests
    fetched = {n: ref for n, ref in inputs.items() if not setup.remote}
    downloads = setup.state_dir / "downloads"
    local_inputs = {n: store.download(ref, downloads, hash_cache=setup.state_dir / HASH_CACHE) for n, ref in fetched.items()}
    manifests = local_inputs if not setup.remote else {
        n: datasets.fetch_manifest(client, ref, setup.state_dir / "manifests") for n, ref in inputs.items() if n in dag.DATASETS}
    read = dataset_inputs(client, inputs, manifests)
    if spec.datasets:  # data prep: what the config's data section names
        read += datasets.config_sources(cfg.data, cfg.seed, setup.state_dir / HASH_CACHE)
    datasets.log(client, run_id, read)
    files = None
    if setup.remote:
        key = checkpoint_digests.signing_key(setup.state_dir)
        files = node_files.RunFiles(
            setup.uri, run_id, {n: ref.run_id for n, ref in inputs.items()}, work_dir.name, key,
            node_files.resumable_run(client, experiment_id, spec.name, fingerprint, run_id, key),
            merge_adapters=not spec.takes_adapters)
        if files.resume_run:
            print(f"[{spec.name}] resuming from the checkpoints of MLflow run {files.resume_run}", flush=True)
        local_inputs = {}
    elif not spec.takes_adapters and any(checkpoint_paths.is_adapter(p) for p in local_inputs.values()):
        local_inputs = merged_adapters(inputs, local_inputs, downloads)  # the stage gets it merged
    output_dir = work_dir / "output"  # with `files`, the worker's node has its own
    if files is None:
        shutil.rmtree(output_dir, ignore_errors=True)  # a previous, interrupted attempt's partial outputs
        output_dir.mkdir(parents=True)
    prior = {}
    if spec.scores_models:  # the models scored before from the same checkpoint are not scored again
        scoring_key = stage_fingerprint(spec, cfg, eval_reuse.non_model_inputs(inputs), setup.state_dir)
        client.set_tag(run_id, eval_reuse.SCORING_TAG, scoring_key)
        prior = eval_reuse.prior_results(client, experiment_id, scoring_key, inputs)
        for model, found in prior.items():
            client.set_tag(run_id, eval_reuse.REUSED_TAG_PREFIX + model, found["run_id"])
    ctx = StageContext(
        stage=spec.name, config=cfg, output_dir=output_dir, work_dir=work_dir,
        log_metrics=MlflowMetrics(setup.uri, run_id), prior_results=prior,
    )
    with system_metrics(setup, run_id):
        result = ray_session.run_stage(spec, ctx, local_inputs, files)
    if ray_session.stopping.is_set():  # a stage that finished while the run was stopped is not published
        raise KeyboardInterrupt("the run is being stopped")

    # the result's keys are the last points of the stage's own series (`eval/loss`): only those it did not log
    held = set(client.get_run(run_id).data.metrics)
    recorded = {k: v for k, v in result.metrics.items() if k not in held}
    if result.compute_span is not None:  # what the stage computed vs its run's length: the orchestration cost
        start, end = result.compute_span
        recorded[store.METRIC_COMPUTE_S] = end - start
        client.set_tag(run_id, run_tags.TAG_COMPUTE_SPAN, f"{start:.3f} {end:.3f}")
    MlflowMetrics(setup.uri, run_id)(recorded, 0)
    info = registry.CheckpointInfo(
        experiment_id=experiment_id, stage=spec.name, summary=spec.summary, fingerprint=fingerprint, config=params,
        pipeline_run=parent_run_id, data=datasets.digests(read),
        parents={n: ref.identity for n, ref in inputs.items() if n not in dag.DATASETS},
    )
    refs = store.publish(client, run_id, result.outputs, spec.register, info, linked=checkpoint_metrics(result.metrics, read),
                         uploaded=files is not None, scratch=output_dir)
    if spec.plots_eval_series:
        eval_report.log_rl_curves(client, run_id)
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    shutil.rmtree(work_dir, ignore_errors=True)
    return refs, result.metrics | {k: v for k, v in recorded.items() if k == store.METRIC_COMPUTE_S}


def merged_adapters(inputs: dict[str, store.ArtifactRef], local: dict[str, Path], downloads: Path) -> dict[str, Path]:
    """Each LoRA adapter input merged into its base model, once per producing run: `materialize` writes beside
    the folder it is given, so it is given the input's place in `downloads` (a link to a folder read in place),
    never the store's own folder."""
    from stages.lora_merge import stage as lora_merge  # peft and torch: in this process only when there is an adapter to merge

    return {n: lora_merge.materialize(store.linked(inputs[n], p, downloads)) if checkpoint_paths.is_adapter(p) else p
            for n, p in local.items()}


def dataset_inputs(client: MlflowClient, inputs: dict[str, store.ArtifactRef], local: dict[str, Path]) -> list:
    """The MLflow dataset inputs of the dataset artifacts among a stage's inputs (from the manifests in their
    local folders)."""
    names = [n for n in local if n in dag.DATASETS]
    uris = {n: f"{client.get_run(inputs[n].run_id).info.artifact_uri}/{n}" for n in names}
    return datasets.dataset_inputs({n: local[n] for n in names}, {n: inputs[n] for n in names}, uris)


def checkpoint_metrics(metrics: dict[str, float], read: list) -> tuple[list[str], object]:
    """What a stage's checkpoint is measured by in the Models tab: its held-out results (`eval/*`), on the
    held-out split it read (its one dataset input of context `eval`)."""
    held_out = [i.dataset for i in read if datasets.context(i) == "eval"]
    return [k for k in metrics if k.startswith("eval/")], held_out[0] if len(held_out) == 1 else None


@contextmanager
def system_metrics(setup: TrackingSetup, run_id: str):
    """MLflow's system metrics (`system/*`: CPU, memory, disk, network, GPU where NVML sees one) of this
    host while the stage runs, every MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL seconds (MLflow's default 10),
    unless `tracking.system_metrics` is off."""
    if not setup.system_metrics:
        yield
        return
    import logging

    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # not a line per stage on the terminal
    monitor = SystemMetricsMonitor(run_id, tracking_uri=setup.uri)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()


@contextmanager
def work_dir_lock(work_dir: Path, stage: str, stopping: threading.Event):
    """One pipeline process at a time trains a given stage + fingerprint (they would share its work dir
    and checkpoints); a second one waits, then finds the first one's run in the cache. The (empty) lock
    files stay: removing one while a process waits on it would let a third one in. The wait ends when
    the run is stopped (Ctrl-C)."""
    locks = work_dir.parent.parent / "locks"  # beside work/, in the state folder
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{work_dir.name}.lock", "w") as lock:
        waiting = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waiting:
                    print(f"[{stage}] waiting: another pipeline run is running this stage with the same fingerprint", flush=True)
                    waiting = True
                if stopping.wait(LOCK_POLL_S):
                    raise KeyboardInterrupt("the run is being stopped") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def unwrap(exc: BaseException) -> BaseException:
    """The stage's own exception behind Ray's wrappers (so a DataError stays a DataError): a task's
    error, or the error an actor's constructor raised."""
    from ray.exceptions import RayTaskError

    from flows.retries import creation_error

    while True:
        if isinstance(exc, RayTaskError) and exc.cause is not None:
            exc = exc.cause
        elif (created := creation_error(exc)) is not None:
            exc = created
        else:
            return exc
