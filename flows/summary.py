"""The table printed at the end of a pipeline run: stage, status, wall time, key metric, MLflow run."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from flows.stage_task import StageOutcome
from stages import dag


def summary_rows(outcomes: dict[str, StageOutcome]) -> list[dict[str, str]]:
    rows = []
    for spec in dag.STAGES:
        o = outcomes.get(spec.name)
        if o is None:
            rows.append({"stage": spec.name, "status": "not run", "time": "-", "metric": "-", "run": "-"})
            continue
        metric = f"{o.key_metric[0]}={o.key_metric[1]:.4g}" if o.key_metric else "-"
        rows.append({"stage": spec.name, "status": o.status, "time": f"{o.seconds:.1f}s", "metric": metric, "run": o.run_id or "-"})
    return rows


def markdown(rows: list[dict[str, str]]) -> str:
    lines = ["| stage | status | wall time | key metric | MLflow run |", "|---|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['status']} | {r['time']} | {r['metric']} | {r['run']} |" for r in rows]
    return "\n".join(lines) + "\n"


def model_table(metrics: dict[str, float]) -> Table | None:
    """The eval stage's `model/metric` values as one row per model."""
    models: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        model, sep, metric = key.partition("/")
        if sep:
            models.setdefault(model, {})[metric] = value
    if not models:
        return None
    columns = sorted({m for values in models.values() for m in values})
    table = Table(title="held-out eval")
    for column in ["model", *columns]:
        table.add_column(column)
    for model, values in models.items():
        table.add_row(model, *(f"{values[c]:.4g}" if c in values else "-" for c in columns))
    return table


def print_summary(rows: list[dict[str, str]], parent_run_id: str, ui_command: str, total_s: float,
                  eval_metrics: dict[str, float] | None = None) -> None:
    table = Table(title=f"rlhf-pipeline run {parent_run_id} ({total_s:.1f}s)")
    for column in ("stage", "status", "wall time", "key metric", "MLflow run"):
        table.add_column(column)
    styles = {"ran": "green", "cached": "cyan", "skipped": "yellow", "failed": "red", "not run": "yellow"}
    for r in rows:
        table.add_row(r["stage"], f"[{styles.get(r['status'], '')}]{r['status']}[/]", r["time"], r["metric"], r["run"])
    console = Console(width=140)
    console.print(table)
    evals = model_table(eval_metrics or {})
    if evals is not None:
        console.print(evals)
    console.print(f"Compare runs in the MLflow UI:  {ui_command}")
