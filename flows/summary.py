"""The table printed at the end of a pipeline run: stage, status, wall time, key metric, MLflow run,
and its lineage (where each consumed artifact came from)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from artifacts.store import ArtifactRef
from flows.stage_task import StageOutcome
from stages.dag import declaration as dag
from stages.eval.results import per_model

COLUMNS = {"stage": "stage", "status": "status", "time": "wall time", "metric": "key metric", "run": "MLflow run",
           "inputs": "inputs from"}


def lineage(inputs: dict[str, str], stage_of_run: dict[str, str]) -> str:
    """The stages this pipeline run fed a stage from (`data_prep, sft`), and in full any artifact that
    came from elsewhere (a pinned `rl_model=runs:/<run>/dpo_model`)."""
    parts: list[str] = []
    for name, identity in inputs.items():
        ref = ArtifactRef.parse(identity)
        stage = stage_of_run.get(ref.run_id)
        part = stage if stage is not None and ref.name == name else f"{name}={identity}"
        if part not in parts:
            parts.append(part)
    return ", ".join(parts) or "-"


def summary_rows(outcomes: dict[str, StageOutcome]) -> list[dict[str, str]]:
    stage_of_run = {o.run_id: o.stage for o in outcomes.values() if o.run_id}
    rows = []
    for spec in dag.STAGES:
        o = outcomes.get(spec.name)
        if o is None:
            rows.append({"stage": spec.name, "status": "not run"} | dict.fromkeys(("time", "metric", "run", "inputs"), "-"))
            continue
        metric = f"{o.key_metric[0]}={o.key_metric[1]:.4g}" if o.key_metric else "-"
        if dropped := int(sum(v for k, v in o.metrics.items() if k.startswith("rows/") and k.endswith("/dropped"))):
            metric += f" ({dropped} rows over data.max_len dropped)"
        rows.append({"stage": spec.name, "status": o.status, "time": f"{o.seconds:.1f}s", "metric": metric,
                     "run": o.run_id or "-", "inputs": lineage(o.inputs, stage_of_run)})
    return rows


def markdown(rows: list[dict[str, str]], link: Callable[[str], str] | None = None) -> str:
    """The table as markdown; `link(run_id)` writes the MLflow run column (a link to the run's page)."""
    def cell(r: dict[str, str], key: str) -> str:
        return link(r[key]) if key == "run" and link is not None and r[key] != "-" else r[key]

    lines = ["| " + " | ".join(COLUMNS.values()) + " |", "|---" * len(COLUMNS) + "|"]
    lines += ["| " + " | ".join(cell(r, key) for key in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def model_table(evaluated: StageOutcome, ranked_by: str | None = None) -> Table | None:
    """The eval stage's `model/metric` values as one row per model it evaluated; `ranked_by` (`eval.metric`) first."""
    models = per_model(evaluated.metrics, evaluated.inputs)
    if not models:
        return None
    columns = sorted({m for values in models.values() for m in values}, key=lambda m: (m != ranked_by, m))
    table = Table(title="held-out eval" + (f" (champion by {ranked_by})" if ranked_by in columns else ""))
    for column in ["model", *columns]:
        table.add_column(column)
    for model, values in models.items():
        table.add_row(model, *(f"{values[c]:.4g}" if c in values else "-" for c in columns))
    return table


def print_summary(rows: list[dict[str, str]], parent_run_id: str, ui_command: str, total_s: float,
                  evaluated: StageOutcome | None = None, ranked_by: str | None = None) -> None:
    table = Table(title=f"rlhf-pipeline run {parent_run_id} ({total_s:.1f}s)")
    for column in COLUMNS.values():
        table.add_column(column)
    styles = {"ran": "green", "cached": "cyan", "skipped": "yellow", "failed": "red", "not run": "yellow"}
    for r in rows:
        table.add_row(*(f"[{styles.get(r['status'], '')}]{r['status']}[/]" if key == "status" else r[key] for key in COLUMNS))
    console = Console(width=180)
    console.print(table)
    evals = model_table(evaluated, ranked_by) if evaluated is not None else None
    if evals is not None:
        console.print(evals)
    console.print(f"Compare runs in the MLflow UI:  {ui_command}")
