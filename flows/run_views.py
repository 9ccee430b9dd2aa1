"""How the pipeline's runs read in the MLflow UI: their names, their descriptions (the run page's
Description, `mlflow.note.content`, rendered as markdown with links to other runs), the headline metrics
a pipeline run carries of its stages, and the light child run that shows a reused stage under the
pipeline run that reused it."""

from __future__ import annotations

import time

from mlflow import MlflowClient
from mlflow.entities import Metric, RunStatus
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from artifacts import run_owner, run_tags, store
from stages.dag import declaration as dag

SEP = " · "
OVERRIDES_WIDTH = 60  # a pipeline run's overrides, cut to this in run names (after what matters most)
TAG_KIND = run_tags.TAG_KIND
TAG_REUSED = "rlhf.reused_run"  # on a cached stage's child run: the stage run it reused
KIND_CACHED = "cached_stage"
HEADLINE_SECTIONS = ("eval/", "rows/", "merge/")  # a stage's results, not its per-step training series


def overrides_text(overrides: list[str] | None) -> str:
    """`rm.max_steps=15 rm.lr=1e-4`, cut to OVERRIDES_WIDTH characters."""
    text = " ".join(overrides or [])
    return text if len(text) <= OVERRIDES_WIDTH else text[: OVERRIDES_WIDTH - 1] + "…"


def config_label(config: str, overrides: list[str] | None, force: list[str] | None = None,
                 only: list[str] | None = None) -> tuple[str, str]:
    """(config, what was asked of it): `--only` and `--force`, then the overrides, name the pipeline run's
    settings (`rlhf run --only rm` that reuses everything is not named as a whole cached run)."""
    asked = [f"--only {','.join(only)}"] if only else []
    asked += [f"--force {','.join(force)}"] if force else []
    return config, overrides_text([*asked, *(overrides or [])])


def outcome_phrase(statuses: dict[str, str]) -> str:
    """What happened, from `{stage: status}`: `7 ran`, `all cached`, `2 ran, 5 cached`, `failed at rl`,
    `stopped during rl` (skipped stages are not counted)."""
    for status, phrase in (("interrupted", "stopped during"), ("failed", "failed at")):
        stages = [stage for stage, s in statuses.items() if s == status]
        if stages:
            return f"{phrase} {', '.join(stages)}"
    ran = sum(s == "ran" for s in statuses.values())
    cached = sum(s == "cached" for s in statuses.values())
    if not ran and not cached:
        return "nothing to run"
    if not ran:
        return "all cached"
    return f"{ran} ran" + (f", {cached} cached" if cached else "")


def pipeline_run_name(label: tuple[str, str], statuses: dict[str, str] | None = None) -> str:
    """`tiny · 7 ran`, `tiny · 1 ran, 6 cached · rm.max_steps=15` (what happened before the overrides, which
    the runs list may cut); `tiny · running` before any outcome."""
    config, overrides = label
    return SEP.join(filter(None, [config, outcome_phrase(statuses) if statuses is not None else "running", overrides]))


def stage_run_name(stage: str, label: tuple[str, str]) -> str:
    """`sft · tiny · rm.max_steps=15`: the stage and the settings of the pipeline run it ran in."""
    return SEP.join(filter(None, [stage, *label]))


def headline_metrics(stage: str, metrics: dict[str, float]) -> dict[str, float]:
    """What a pipeline run carries of a stage's metrics (their last values): its key metric, its results
    (`eval/*`, `rows/*`, `merge/*`; every per-model metric of the eval stage) and its compute time, under
    the stage's name: `sft/eval/loss`, `eval/rl/sampled_accuracy`, `rl/time/compute_s`."""
    key = dag.BY_NAME[stage].key_metric

    def wanted(name: str) -> bool:
        if name in (key, store.METRIC_COMPUTE_S):
            return True
        if dag.BY_NAME[stage].scores_models:  # `<model>/<metric>` and the score
            return not name.startswith(("time/", "system/"))
        return name.startswith(HEADLINE_SECTIONS)

    return {f"{stage}/{name}": value for name, value in sorted(metrics.items()) if wanted(name)}


def ui_page(experiment_id: str) -> str:
    """The experiment's runs list in the MLflow UI, in its model-training view (the UI opens on GenAI otherwise)."""
    return f"#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def run_link(experiment_id: str, run_id: str, text: str | None = None) -> str:
    """A markdown link to a run's page in the MLflow UI (its routes live after `#`)."""
    return f"[{text or run_id[:8]}](#/experiments/{experiment_id}/runs/{run_id})"


def stage_description(spec: dag.StageSpec, experiment_id: str, parent_id: str, fingerprint: str,
                      inputs: dict[str, str]) -> str:
    """A stage run's Description: what it makes, the pipeline run it ran in, what it read, its fingerprint."""
    lines = [f"**{spec.name}**: {spec.summary}.", "",
             f"Ran in pipeline run {run_link(experiment_id, parent_id)}; fingerprint `{fingerprint}` "
             "(a later run with the same one reuses this run)."]
    if inputs:
        lines += ["", "Inputs: " + ", ".join(f"`{name}` from {run_link(experiment_id, store.ArtifactRef.parse(identity).run_id)}"
                                             for name, identity in inputs.items())]
    return "\n".join(lines) + "\n"


def pipeline_description(title: str, table: str, total_s: float) -> str:
    """A pipeline run's Description: its name, then the summary table (links to the stage runs it ran or reused)."""
    return f"**{title}** ({total_s:.1f} s)\n\n{table}"


def record_reuse(client: MlflowClient, experiment_id: str, parent_id: str, stage: str, cached) -> str:
    """A finished child run of the pipeline run for a stage it reused (`sft · cached`): it links the run
    that made the result, carries that run's headline metrics (unprefixed) and datasets, and is nobody's
    cache entry (no `rlhf.stage` tag). Returns its id."""
    made_in = cached.data.tags.get(run_tags.TAG_PARENT)
    note = (f"**{stage}**: reused {run_link(experiment_id, cached.info.run_id, cached.info.run_name)}"
            + (f" of pipeline run {run_link(experiment_id, made_in)}" if made_in else "")
            + f"; fingerprint `{cached.data.tags.get(run_tags.TAG_FINGERPRINT, '')}`. Nothing ran.\n")
    run_id = client.create_run(experiment_id, run_name=stage + SEP + "cached", tags={
        run_tags.TAG_PARENT: parent_id, TAG_KIND: KIND_CACHED, TAG_REUSED: cached.info.run_id, MLFLOW_RUN_NOTE: note,
        **run_owner.owner_tags()}).info.run_id
    now = int(time.time() * 1000)
    copied = {name.removeprefix(f"{stage}/"): v for name, v in headline_metrics(stage, dict(cached.data.metrics)).items()}
    if copied:
        client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in copied.items()])
    if cached.inputs is not None and cached.inputs.dataset_inputs:
        client.log_inputs(run_id, datasets=cached.inputs.dataset_inputs)
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run_id
