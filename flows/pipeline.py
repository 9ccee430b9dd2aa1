"""The `rlhf-pipeline` Prefect flow: every stage of `stages.dag.declaration.STAGES` as a task, each started
as soon as its upstream stages are done, inside one MLflow parent run and one Ray session."""

from __future__ import annotations

import signal
import threading
import time
import traceback
from contextlib import contextmanager

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import ExternalSignal
from prefect.futures import PrefectFuture, wait
from prefect.runtime import deployment
from prefect.states import Cancelled, Completed, Failed, State

from artifacts import disk_full, run_owner, run_tags, store, tracking
from artifacts import model_registry as registry
from configs import load_config
from configs.errors import PipelineError, first_line
from configs.loader import flatten
from configs.redaction import logged, redacted
from configs.remote_overrides import refuse_code_overrides, refuse_other_config
from configs.schema import PipelineConfig
from flows import eval_report, pre_run, retries, run_end, run_views
from flows.services.ray_cluster import RaySession, session_for
from flows.stage_task import HASH_CACHE, StageOutcome, execute_stage
from flows.summary import markdown, print_summary, summary_rows
from stages.dag import declaration as dag
from stages.dag import preflight
from stages.dag.plan import plan
from stages.rl.layout import describe_layout

FLOW_NAME = "rlhf-pipeline"
STOP_WAIT_S = 20.0  # after Ctrl-C, how long the stage threads get to record their runs as interrupted


# MLflow, not Prefect, is the cache (it survives a wiped Prefect DB); see stages/dag/declaration.py and artifacts/.
@task(name="stage", cache_policy=NO_CACHE)
def stage_task(stage: str, cfg: PipelineConfig, setup, experiment_id: str, parent_run_id: str,
               upstream: dict[str, StageOutcome], force: bool, ray_session: RaySession, reuse_only: bool = False,
               pins: dict | None = None, label: tuple[str, str] = ("", "")):
    outcome = execute_stage(dag.BY_NAME[stage], cfg, setup, experiment_id, parent_run_id, upstream, force, ray_session,
                            reuse_only, pins, label)
    if outcome.status == "failed":
        return Failed(message=redacted(f"{stage}: {outcome.error}"), data=outcome)
    if outcome.status == "interrupted":  # Cancelled, not Failed: never retried
        return Cancelled(message=f"{stage}: interrupted", data=outcome)
    return Completed(name="Cached" if outcome.status == "cached" else "Completed", data=outcome)


@flow(name=FLOW_NAME)
def rlhf_pipeline(config: str = "tiny", overrides: list[str] | None = None, force: list[str] | None = None,
                  only: list[str] | None = None) -> list[dict] | State:
    """Run the DAG; returns the summary rows. A user-facing error (a failed pre-run check, the first
    failed stage's, a full disk) ends the flow run Failed with its one line, which calling the flow
    raises: returned as the state, not raised here, so that Prefect does not log a traceback for it.

    `only`: run just these stages; the stages they need are reused from MLflow (their cached runs for
    this config), never run, and nothing downstream runs."""
    try:
        if deployment.id is not None:  # started through the Prefect server, by whoever reaches it
            refuse_other_config(config, registered_config(deployment.id))
            refuse_code_overrides(config, overrides or [])
        return run_pipeline(config, overrides, force, only)
    except PipelineError as error:
        return Failed(message=redacted(str(error)), data=error)


def registered_config(deployment_id: str) -> str | None:
    """The config the deployment was registered with (its default `config` parameter, set by whoever served it;
    a run's own parameters are the caller's)."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            return client.read_deployment(deployment_id).parameters.get("config")
    except Exception as exc:  # noqa: BLE001 - whatever the API says, the run cannot be checked: one line
        raise PipelineError(f"deployment {deployment_id}: its registered config could not be read from the Prefect "
                            f"API ({type(exc).__name__}: {first_line(exc)}); run it again once the server answers") from None


def run_pipeline(config: str, overrides: list[str] | None, force: list[str] | None, only: list[str] | None) -> list[dict]:
    started = time.monotonic()
    loaded = load_config(config, overrides or [])
    # a deployment's run enters here, past the CLI: its checks come before any stage is submitted
    pre_run.check(loaded, force or [], only or [])
    cfg = preflight.with_rl_layout(loaded)
    if cfg.rl.rollout.engine != loaded.rl.rollout.engine:
        print(f"[rl] rl.rollout.engine=auto: {describe_layout(cfg)} on the local Ray cluster", flush=True)
    # a forced stage reruns; its consumers rerun because their inputs' identity (the new run) changed
    forced = set(force or [])
    planned = plan(cfg, only or [])
    reused = {name for name, step in planned.items() if step.status == "reused"}
    setup = tracking.resolve(cfg.tracking)
    with disk_full.reported(setup.state_dir, setup.sqlite_file):
        client = tracking.open_store(setup)
        experiment_id = tracking.experiment_id(client, setup)
        if closed := run_owner.close_orphans(client, experiment_id):  # first: a pin never resolves to one of them
            print(f"[mlflow] marked FAILED {len(closed)} run(s) left RUNNING by a process that ended: {', '.join(closed)}",
                  flush=True)
        pins = {name: store.resolve_pin(client, f"inputs.{name}", uri, experiment_id, setup.state_dir / HASH_CACHE)
                for name, uri in cfg.inputs.items()}
        label = run_views.config_label(config, overrides, force, only)
        parent = client.create_run(
            experiment_id,
            run_name=run_views.pipeline_run_name(label),
            tags={run_tags.TAG_KIND: run_tags.KIND_PIPELINE, run_tags.TAG_CONFIG: logged(config),
                  run_tags.TAG_OVERRIDES: logged(" ".join(overrides or [])),
                  "rlhf.force": ",".join(force or []), "rlhf.only": ",".join(only or []), **run_owner.owner_tags()},
        )
    parent_id = parent.info.run_id
    with failing(client, parent_id, setup):
        params = flatten(cfg.model_dump(mode="json"))
        client.log_batch(parent_id, params=[Param(k, logged(v)) for k, v in params.items()])

        ray_session = session_for(cfg.infra)
        scheduled = {name for name, step in planned.items() if step.scheduled}
        ray_session.preload_drivers(cfg, scheduled)
        futures: dict[str, PrefectFuture[StageOutcome]] = {}
        try:
            for spec in dag.STAGES:  # declared in dependency order
                if spec.name not in scheduled:
                    continue
                upstream = {name: futures[name] for name in dag.upstream(spec) if name in futures}
                options = retries.task_options(cfg, spec.name)
                futures[spec.name] = stage_task.with_options(name=spec.name, task_run_name=spec.name, **options).submit(
                    # Prefect hands the task the upstream futures' results; its submit() types want those results here
                    spec.name, cfg, setup, experiment_id, parent_id, upstream,  # type: ignore[arg-type]
                    spec.name in forced, ray_session, spec.name in reused, pins, label,
                )
            wait(list(futures.values()))
        except (KeyboardInterrupt, ExternalSignal) as exc:
            # Ctrl-C (or Prefect's SIGTERM) lands here, in the main thread, not in the task threads the
            # stages run in: stop their work, and give them STOP_WAIT_S to record their runs as interrupted
            if isinstance(exc, ExternalSignal):
                run_end.stop_began(getattr(exc, "signal", signal.SIGTERM))
            ray_session.stop()
            deadline = time.monotonic() + STOP_WAIT_S
            for future in futures.values():
                future.wait(timeout=max(0.0, deadline - time.monotonic()))
            client.update_run(parent_id, name=run_views.pipeline_run_name(label, {
                name: "interrupted" for name, future in futures.items() if future.state.is_cancelled()}))
            client.set_terminated(parent_id, RunStatus.to_string(RunStatus.KILLED))
            if isinstance(exc, KeyboardInterrupt):
                raise KeyboardInterrupt(interrupted_message(futures)) from None
            exc.args = (interrupted_message(futures),)  # Prefect's engine marks the flow run crashed, then re-raises it
            raise
        except BaseException:
            ray_session.shutdown()
            raise
        # the cluster winds down (its workers' last log lines, then Ray's shutdown) while the results are published
        closing = threading.Thread(target=ray_session.shutdown, name="ray-shutdown")
        closing.start()
        try:
            rows, evaluated, failed = publish(client, experiment_id, parent_id, label, futures, cfg, started)
        finally:
            closing.join()
        ui = setup.ui_page(run_views.ui_page(experiment_id))
        print_summary(rows, parent_id, ui, time.monotonic() - started, evaluated, cfg.eval.metric)
        if failed:
            raise stage_failure(failed[0])
        return rows


def publish(client: MlflowClient, experiment_id: str, parent_id: str, label: tuple[str, str], futures: dict,
            cfg: PipelineConfig, started: float) -> tuple[list[dict[str, str]], StageOutcome | None, list[StageOutcome]]:
    """The finished stages' outcomes onto the pipeline run (tags, eval's verdicts, summary, headline metrics)
    and its end status: (summary rows, eval's outcome, the failed stages)."""
    outcomes: dict[str, StageOutcome] = {}
    for name, future in futures.items():
        state = future.state
        if state.is_completed() or state.is_failed():
            data = state.result(raise_on_failure=False)
            if isinstance(data, StageOutcome):
                outcomes[name] = data
    for outcome in outcomes.values():
        client.set_tag(parent_id, f"stage.{outcome.stage}", f"{outcome.status} {outcome.run_id or ''}".strip())
    evaluated = next((outcomes[s.name] for s in dag.STAGES if s.scores_models and s.name in outcomes), None)
    if evaluated is not None and evaluated.status == "ran":
        assert evaluated.run_id is not None  # a stage that ran made its run
        verdicts = eval_report.publish(client, evaluated.run_id, evaluated.inputs, evaluated.metrics, cfg.eval.metric)
        for name, (version, verdict) in verdicts.items():
            where = f" (models:/{name}@{registry.CHAMPION})" if verdict.startswith(registry.CHAMPION) else ""
            print(f"[eval] {name} version {version}: {verdict}{where}", flush=True)
    rows = summary_rows(outcomes)
    client.log_text(parent_id, markdown(rows), "summary.md")
    record_outcomes(client, experiment_id, parent_id, label, outcomes, rows, time.monotonic() - started)
    failed = [o for o in outcomes.values() if o.status == "failed"]
    client.set_terminated(parent_id, RunStatus.to_string(RunStatus.FAILED if failed else RunStatus.FINISHED))
    return rows, evaluated, failed


def record_outcomes(client: MlflowClient, experiment_id: str, parent_id: str, label: tuple[str, str],
                    outcomes: dict[str, StageOutcome], rows: list[dict[str, str]], total_s: float) -> None:
    """What the pipeline run shows in the MLflow UI: a name saying what happened (`tiny · all cached`), the
    summary table with links to its stage runs as its description, and each stage's headline metrics
    (`sft/eval/loss`, `eval/rl/sampled_accuracy`), so that two pipeline runs compare side by side."""
    name = run_views.pipeline_run_name(label, {stage: o.status for stage, o in outcomes.items() if o.status != "skipped"})
    table = markdown(rows, lambda run_id: run_views.run_link(experiment_id, run_id))
    client.update_run(parent_id, name=name)
    client.set_tag(parent_id, MLFLOW_RUN_NOTE, run_views.pipeline_description(name, table, total_s))
    now = int(time.time() * 1000)
    headline = {k: v for o in outcomes.values() for k, v in run_views.headline_metrics(o.stage, o.metrics).items()}
    if headline:
        client.log_batch(parent_id, metrics=[Metric(k, v, now, 0) for k, v in headline.items()])


@contextmanager
def failing(client: MlflowClient, run_id: str, setup: tracking.TrackingSetup):
    """The pipeline run is FAILED, not left RUNNING, when the block raises (a full disk as its one line)."""
    try:
        with disk_full.reported(setup.state_dir, setup.sqlite_file):
            yield
    except (KeyboardInterrupt, ExternalSignal):
        raise  # the run is KILLED already
    except BaseException as exc:
        store.try_mark_failed(client, run_id, "".join(traceback.format_exception(exc)))
        raise


def interrupted_message(futures: dict) -> str:
    """`stopped during stage rl; rerun to resume`: the stages whose runs the interrupt ended."""
    stopped = [name for name, future in futures.items() if future.state.is_cancelled()
               and getattr(future.state.result(raise_on_failure=False), "run_id", None)]
    where = f" during stage {', '.join(stopped)}" if stopped else ""
    return f"stopped{where}; rerun to resume"


def stage_failure(outcome: StageOutcome) -> BaseException:
    """What the flow fails with: a user-facing error as it is, anything else as one line naming the
    stage and where its traceback is kept (the worker also printed it above)."""
    error = outcome.error
    assert error is not None  # a failed outcome carries its error
    if isinstance(error, PipelineError):
        return error
    kind = "a transient fault, retries exhausted" if retries.transient(error) else "an unexpected error"
    where = f"; traceback in MLflow run {outcome.run_id} (tag rlhf.error)" if outcome.run_id else ""
    failure = PipelineError(f"stage {outcome.stage} failed ({kind}): {type(error).__name__}: {first_line(error)}{where}")
    failure.__cause__ = error
    return failure
