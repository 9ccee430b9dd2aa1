"""Which stage runs `rlhf verify RUN_ID` reruns, and with what: the run id as a pipeline run (its completed
stages, in DAG order) or one stage run, each with the config its pipeline run was started with (`rlhf.config`
and `rlhf.overrides`, checked against the params the stage run recorded) and the inputs its lineage tags name."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from artifacts import fingerprint as fp
from artifacts import imported, run_tags, store
from configs import load_config
from configs.errors import PipelineError
from configs.loader import flatten
from configs.redaction import logged, redacted
from configs.schema import PipelineConfig
from flows.cli.runs import stage_outcomes
from flows.stage_task import stage_fingerprint
from stages.dag import declaration as dag
from stages.dag import preflight

VERIFIED = ("ran", "cached")  # a pipeline run's stages that have a complete run to compare with
# `rlhf.overrides` holds a run's overrides joined by spaces: a new one begins where `key=` follows a space
OVERRIDE_START = re.compile(r"\s+(?=[A-Za-z_][\w.]*=)")


@dataclass(frozen=True)
class Target:
    """One stage run to rerun: its config (preset or file, and overrides) and the inputs it consumed."""

    stage: str
    run: Run
    config: str
    overrides: tuple[str, ...]
    # artifact name -> identity in the original store (`runs:/<run>/<name>`): what the stage consumed (its lineage),
    # and what the config pins from that store besides (its checks may ask for a pin the stage does not read)
    inputs: dict[str, str]
    note: str | None = None  # what makes a difference less telling (the stage's code changed since)


def split_overrides(text: str) -> list[str]:
    """`rlhf.overrides` back into the overrides it joined (`sft.lr=3e-4 seed=7` -> two)."""
    return [part for part in OVERRIDE_START.split(text.strip()) if part]


def get_run(client: MlflowClient, run_id: str) -> Run:
    try:
        return client.get_run(run_id)
    except MlflowException:
        raise PipelineError(f"run {run_id}: no such run in {redacted(client.tracking_uri)}; `rlhf runs` lists the "
                            "pipeline runs") from None


def stage_runs(client: MlflowClient, run: Run) -> tuple[Run, list[Run]]:
    """(the pipeline run, the stage runs to verify, in DAG order) for a pipeline or stage run id."""
    run_id, status = run.info.run_id, run.info.status
    if run.data.tags.get(run_tags.TAG_KIND) == run_tags.KIND_PIPELINE:
        if status != "FINISHED":
            raise PipelineError(f"run {run_id}: the pipeline run is {status}, not finished; verify takes a finished "
                                "run (`rlhf runs` shows each one's status), or one of its complete stage runs")
        runs = [get_run(client, stage_run) for _, (outcome, stage_run) in stage_outcomes(run).items()
                if outcome in VERIFIED and stage_run]
        return run, runs
    stage = run.data.tags.get(run_tags.TAG_STAGE)
    if stage is None:
        raise PipelineError(f"run {run_id}: neither a pipeline run nor a stage run; `rlhf runs` lists the pipeline runs")
    if status != "FINISHED" or run.data.tags.get(run_tags.TAG_STATUS) != run_tags.COMPLETE:
        state = run.data.tags.get(run_tags.TAG_STATUS) or status
        raise PipelineError(f"run {run_id}: the {stage} run is {status} ({state}), not complete; verify takes a stage "
                            "run that finished with all its outputs")
    parent_id = run.data.tags.get(run_tags.TAG_PARENT)
    if parent_id is None:
        raise PipelineError(f"run {run_id}: the {stage} run names no pipeline run (tag {run_tags.TAG_PARENT}), so its "
                            "config is unknown; verify its pipeline run instead")
    return get_run(client, parent_id), [run]


def stage_config(config: str, overrides: list[str]) -> PipelineConfig:
    """The config as the pipeline run resolved it (`rl.rollout.engine: auto` for this machine)."""
    return preflight.with_rl_layout(load_config(config, overrides))


def recorded_params(spec: dag.StageSpec, cfg: PipelineConfig) -> dict[str, str]:
    """The params a run of `spec` on `cfg` records (`flows.stage_task.run_and_publish`)."""
    subset = fp.config_subset(cfg, spec.wanted_config(spec.config_keys, cfg))
    return {key: logged(value) for key, value in flatten(subset).items()}


def check_config(run: Run, spec: dag.StageSpec, cfg: PipelineConfig, config: str) -> None:
    """The config gives the stage the values its run recorded, or one line naming the first key that moved."""
    now, then = recorded_params(spec, cfg), run.data.params
    for key in sorted(set(now) | set(then)):
        if now.get(key) != then.get(key):
            raise PipelineError(f"run {run.info.run_id} ({spec.name}): its config {config} now gives {key}={now.get(key)}, "
                                f"the run recorded {then.get(key)}; the config changed since the run, so its stages "
                                "cannot be rerun as they ran")


def store_pins(client: MlflowClient, cfg: PipelineConfig, experiment_id: str) -> dict[str, str]:
    """`{artifact: identity}` of the config's pins that name the original store (`runs:/`, `models:/`): a scratch
    store has no such run. A folder or hub id is imported there as it was here."""
    return {name: store.resolve_pin(client, f"inputs.{name}", uri, experiment_id).identity
            for name, uri in cfg.inputs.items() if not imported.is_external(uri)}


def find(client: MlflowClient, run_id: str, only: list[str]) -> list[Target]:
    """The stage runs to rerun for `run_id`, less those `only` (stage names; empty: all) leaves out."""
    dag.check_stages(only, "--stages")
    parent, runs = stage_runs(client, get_run(client, run_id))
    config = parent.data.tags.get(run_tags.TAG_CONFIG) or "tiny"
    overrides = split_overrides(parent.data.tags.get(run_tags.TAG_OVERRIDES, ""))
    named = {r.data.tags[run_tags.TAG_STAGE]: r for r in runs}
    if missing := [s for s in only if s not in named]:
        raise PipelineError(f"--stages {','.join(missing)}: run {run_id} has no complete run of it (it has: "
                            f"{', '.join(named) or 'none'})")
    if not named:
        raise PipelineError(f"run {run_id}: no stage of it finished with its outputs; nothing to verify")
    cfg = stage_config(config, overrides)
    pinned = store_pins(client, cfg, parent.info.experiment_id)
    targets = []
    for spec in dag.STAGES:
        run = named.get(spec.name)
        if run is None or (only and spec.name not in only):
            continue
        check_config(run, spec, cfg, config)
        inputs = store.run_inputs(run)
        now = stage_fingerprint(spec, cfg, {n: store.ArtifactRef.parse(i) for n, i in inputs.items()})
        moved = now != run.data.tags.get(run_tags.TAG_FINGERPRINT)
        targets.append(Target(spec.name, run, config, tuple(overrides), pinned | inputs,
                              "its code or the files its config names changed since the run" if moved else None))
    return targets
