"""What a finished eval run adds to the store: the registry's `champion` aliases (by `eval.metric`), a
child run per evaluated model with the same `eval/*` keys (selected together, the MLflow UI charts the
models side by side; each links its logged model and holds its samples as an MLflow table), and a
titled comparison plot; and, for the RL run, its headline curves as a plot of its own."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from mlflow import MlflowClient
from mlflow.entities import Metric, RunStatus
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from artifacts import model_registry as registry
from artifacts import run_owner, run_tags
from artifacts.datasets import context
from artifacts.store import METRIC_RESUMED, ArtifactRef
from stages.eval.results import model_inputs, per_model

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BAR_METRICS = ("reward", "sampled_reward", "accuracy", "sampled_accuracy")  # plotted where present
RL_CURVES = ("train/reward", "train/kl", "train/response_length")  # the RL run's headline curves
PLOT = "plots/eval_by_model.png"
RL_PLOT = "plots/rl_curves.png"
SAMPLES_TABLE = "eval_samples.json"  # in each model's child run: the Evaluation view compares them by prompt
KIND_EVAL_MODEL = "eval_model"


def metrics_figure(models: dict[str, dict[str, float]], ranked_by: str) -> Figure:
    """Grouped bars: each model's `ranked_by` metric first, then its greedy and sampled held-out reward
    and accuracy where present."""
    from matplotlib.figure import Figure  # where a run draws, not at every `rlhf run`'s start

    fig = Figure(figsize=(2.0 * len(models) + 2, 3.8))
    ax = fig.subplots()
    wanted = dict.fromkeys((ranked_by, *BAR_METRICS))
    shown = [m for m in wanted if any(m in values for values in models.values())]
    width = 0.8 / max(len(shown), 1)
    for i, metric in enumerate(shown):
        xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(models))]
        bars = ax.bar(xs, [values.get(metric, 0.0) for values in models.values()], width, label=metric.replace("_", " "))
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(range(len(models)), list(models))
    ax.axhline(0, color="black", linewidth=0.5)  # rewards from an RM can be negative
    ax.set_ylabel("held-out score")
    ax.set_title(f"champion by {ranked_by.replace('_', ' ')}", fontsize=9)
    fig.suptitle("Held-out eval by model")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def curves_figure(curves: dict[str, list[tuple[int, float]]], title: str = "RL training curves") -> Figure:
    """One panel per metric history, against the training step."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(curves), 3.4))
    axes = fig.subplots(1, len(curves), squeeze=False)[0]
    for ax, (name, points) in zip(axes, curves.items()):
        ax.plot([s for s, _ in points], [v for _, v in points], marker=".")
        ax.set_xlabel("step")
        ax.set_title(name)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def history(client: MlflowClient, run_id: str, metric: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))


def log_rl_curves(client: MlflowClient, rl_run_id: str) -> None:
    """The RL run's reward, KL and response length per step, as `plots/rl_curves.png` of that run."""
    curves = rl_curves(client, rl_run_id)
    if curves:
        client.log_figure(rl_run_id, curves_figure(curves), RL_PLOT)


def rl_curves(client: MlflowClient, rl_run_id: str) -> dict[str, list[tuple[int, float]]]:
    """The curves of `RL_CURVES`, whole: a run that resumed from a checkpoint logged only the steps after it, so the
    earlier steps come from the attempts it continued (`earlier_attempts`), a later attempt's point replacing an
    earlier one's; the figure is then the one the uninterrupted run draws."""
    run = client.get_run(rl_run_id)
    attempts = [*(earlier_attempts(client, run) if METRIC_RESUMED in run.data.metrics else []), rl_run_id]
    curves = {}
    for name in RL_CURVES:
        points: dict[int, float] = {}
        for attempt in attempts:
            points.update(history(client, attempt, name))
        if points:
            curves[name] = sorted(points.items())
    return curves


def earlier_attempts(client: MlflowClient, run) -> list[str]:
    """The runs of the same stage work (its stage and fingerprint) started before `run`, oldest first: those a kill or
    a fault ended, whose checkpoints it resumed from."""
    tags = run.data.tags
    found = client.search_runs(
        [run.info.experiment_id],
        filter_string=f"tags.`{run_tags.TAG_STAGE}` = '{tags[run_tags.TAG_STAGE]}' and "
                      f"tags.`{run_tags.TAG_FINGERPRINT}` = '{tags[run_tags.TAG_FINGERPRINT]}'",
        order_by=["attributes.start_time ASC"], max_results=1000)
    return [r.info.run_id for r in found if r.info.run_id != run.info.run_id and r.info.start_time <= run.info.start_time]


def logged_model_of(client: MlflowClient, experiment_id: str, identity: str) -> str | None:
    """The logged model of a checkpoint artifact (`runs:/<run>/<name>`), if its run logged one."""
    ref = ArtifactRef.parse(identity)
    found = client.search_logged_models([experiment_id], filter_string=f"source_run_id = '{ref.run_id}' AND name = '{ref.name}'",
                                        max_results=1)
    return found[0].model_id if found else None


def samples(client: MlflowClient, eval_run_id: str, model: str) -> dict[str, list] | None:
    """A model's scored generations (`eval_report/samples_<model>.jsonl`) as table columns."""
    import mlflow

    try:
        text = mlflow.artifacts.load_text(f"{client.get_run(eval_run_id).info.artifact_uri}/eval_report/samples_{model}.jsonl")
    except Exception:  # noqa: BLE001 - an eval run without samples still gets its metrics
        return None
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return {key: [row.get(key) for row in rows] for key in dict.fromkeys(k for row in rows for k in row)} if rows else None


def log_model_runs(client: MlflowClient, eval_run_id: str, inputs: dict[str, str], metrics: dict[str, float]) -> dict[str, str]:
    """A child run of the eval run per model (`eval · sft`): its metrics as `eval/<metric>` (the keys the RL
    run's periodic evals use), linked to the model's logged model and the held-out dataset, its samples as
    an MLflow table. Returns `{model: child run id}`."""
    run = client.get_run(eval_run_id)
    experiment_id = run.info.experiment_id
    held_out = [i for i in (run.inputs.dataset_inputs if run.inputs else []) if context(i) == "eval" and i.dataset.name == "eval_data"]
    dataset = held_out[0].dataset if held_out else None
    identities = model_inputs(inputs)
    children = {}
    now = int(time.time() * 1000)
    for model, values in per_model(metrics, inputs).items():
        identity = identities[model]
        model_id = logged_model_of(client, experiment_id, identity)
        note = (f"**{model}** (`{identity}`) on the held-out prompts, from eval run "
                f"[{run.info.run_name}](#/experiments/{experiment_id}/runs/{eval_run_id}). Select several of these runs "
                f"to chart their `eval/*` metrics side by side; `{SAMPLES_TABLE}` holds the responses.\n")
        child = client.create_run(experiment_id, run_name=f"eval · {model}", tags={
            run_tags.TAG_PARENT: eval_run_id, "rlhf.kind": KIND_EVAL_MODEL, "rlhf.model": model, "rlhf.model_source": identity,
            MLFLOW_RUN_NOTE: note, **run_owner.owner_tags()}).info.run_id
        client.log_batch(child, metrics=[Metric(f"eval/{k}", v, now, 0, model_id=model_id,
                                                dataset_name=dataset.name if dataset else None,
                                                dataset_digest=dataset.digest if dataset else None) for k, v in values.items()])
        if held_out:
            client.log_inputs(child, datasets=held_out)
        if (table := samples(client, eval_run_id, model)) is not None:
            client.log_table(child, table, SAMPLES_TABLE)
        client.set_terminated(child, RunStatus.to_string(RunStatus.FINISHED))
        children[model] = child
    return children


def publish(client: MlflowClient, eval_run_id: str, inputs: dict[str, str], metrics: dict[str, float],
            ranked_by: str) -> dict[str, tuple[str, str]]:
    """Tag each evaluated registered version with its `ranked_by` score (`eval.metric`) and hold the
    champion contest (`registry.promote_champions`), add a child run per model and log the comparison
    plot to the eval run. Returns `{registered model: (version, verdict)}` for each version scored."""
    scored = []
    for model, identity in model_inputs(inputs).items():
        key = f"{model}/{ranked_by}"
        if key in metrics:
            ref = ArtifactRef.parse(identity)
            scored.append((ref.name, ref.run_id, metrics[key]))
    verdicts = registry.promote_champions(client, scored, ranked_by, eval_run_id)
    models = per_model(metrics, inputs)
    if models:
        log_model_runs(client, eval_run_id, inputs, metrics)
        client.log_figure(eval_run_id, metrics_figure(models, ranked_by), PLOT)
    return verdicts
