"""Reading past pipeline runs back from MLflow: `rlhf runs` and `rlhf compare`."""

from __future__ import annotations

import datetime

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from rich.table import Table

from artifacts import run_tags
from configs.errors import PipelineError
from stages.dag import declaration as dag

STAGE_TAG = "stage."
# the key metrics' names in runs made before the stages shared one metric scheme: old stores still compare
EARLIER_KEYS = {"rows/sft_data/train": "sft_data_train_rows", "eval/loss": "eval_loss", "eval/accuracy": "eval_acc",
                "eval/step_accuracy": "eval_step_acc", "eval/reward": "eval_reward",
                "eval/reward_accuracy": "eval_reward_acc", "merge/max_logit_diff": "max_logit_diff"}


def pipeline_runs(client: MlflowClient, experiment_id: str, limit: int):
    return client.search_runs(
        [experiment_id], "tags.`rlhf.kind` = 'pipeline'", order_by=["attributes.start_time DESC"], max_results=limit
    )


def stage_outcomes(run) -> dict[str, tuple[str, str | None]]:
    """`{"sft": ("ran", run_id), ...}` from the parent run's tags, in pipeline order."""
    found = {}
    for spec in dag.STAGES:
        value = run.data.tags.get(STAGE_TAG + spec.name)
        if value:
            status, *run_id = value.split()
            found[spec.name] = (status, run_id[0] if run_id else None)
    return found


def runs_table(runs) -> Table:
    table = Table(title="pipeline runs (newest first)")
    for column in ("run", "started", "status", "config", "stages"):
        table.add_column(column)
    for run in runs:
        started = datetime.datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M:%S")
        config = " ".join(filter(None, [run.data.tags.get(run_tags.TAG_CONFIG, ""), run.data.tags.get(run_tags.TAG_OVERRIDES, "")]))
        stages = ", ".join(f"{name} {status}" for name, (status, _) in stage_outcomes(run).items())
        table.add_row(run.info.run_id, started, run.info.status, config, stages)
    return table


def comparison(client: MlflowClient, run_ids: list[str]) -> dict[str, dict[str, str]]:
    """`{row label: {run id: value}}`: each stage's status and key metric, then each eval metric per model."""
    rows: dict[str, dict[str, str]] = {}
    for run_id in run_ids:
        try:
            parent = client.get_run(run_id)
        except MlflowException:
            raise PipelineError(f"run {run_id}: no such MLflow run in {client.tracking_uri}") from None
        if parent.data.tags.get(run_tags.TAG_KIND) != run_tags.KIND_PIPELINE:
            raise PipelineError(f"run {run_id}: not a pipeline run (pick one from `rlhf runs`)")
        for stage, (status, stage_run_id) in stage_outcomes(parent).items():
            metrics = client.get_run(stage_run_id).data.metrics if stage_run_id else {}
            key = dag.BY_NAME[stage].key_metric
            value = metrics.get(key, metrics.get(EARLIER_KEYS.get(key, key)))
            shown = f"{value:.4g}" if value is not None else "-"
            rows.setdefault(f"{stage}: {key}", {})[run_id] = f"{shown} ({status})"
            if dag.BY_NAME[stage].scores_models:
                for name, value in sorted(metrics.items()):
                    if "/" in name:
                        rows.setdefault(f"eval {name}", {})[run_id] = f"{value:.4g}"
    return rows


def comparison_table(rows: dict[str, dict[str, str]], run_ids: list[str]) -> Table:
    table = Table(title="pipeline runs side by side")
    table.add_column("stage / metric")
    for run_id in run_ids:
        table.add_column(run_id[:12])
    for label, values in rows.items():
        table.add_row(label, *(values.get(run_id, "-") for run_id in run_ids))
    return table
