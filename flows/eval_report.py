"""What a finished eval run adds to the store: the registry's `champion` aliases (by `eval.metric`) and
comparison plots (held-out rewards and accuracies per model; the RL policy's reward and KL curves) as
PNG artifacts of the eval run."""

from __future__ import annotations

from matplotlib.figure import Figure
from mlflow import MlflowClient

from artifacts import registry
from artifacts.store import ArtifactRef
from stages.eval_results import model_inputs, per_model

BAR_METRICS = ("reward", "sampled_reward", "accuracy", "sampled_accuracy")  # plotted where present
RL_CURVES = ("reward", "kl")
PLOT = "plots/eval_by_model.png"


def metrics_figure(models: dict[str, dict[str, float]], ranked_by: str) -> Figure:
    """Grouped bars: each model's `ranked_by` metric first, then its greedy and sampled held-out reward
    and accuracy where present."""
    fig = Figure(figsize=(2.0 * len(models) + 2, 3.6))
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
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def curves_figure(curves: dict[str, list[tuple[int, float]]]) -> Figure:
    """One panel per metric history, against the training step."""
    fig = Figure(figsize=(4.2 * len(curves), 3.2))
    axes = fig.subplots(1, len(curves), squeeze=False)[0]
    for ax, (name, points) in zip(axes, curves.items()):
        ax.plot([s for s, _ in points], [v for _, v in points], marker=".")
        ax.set_xlabel("step")
        ax.set_title(f"RL {name}")
    fig.tight_layout()
    return fig


def history(client: MlflowClient, run_id: str, metric: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))


def publish(client: MlflowClient, eval_run_id: str, inputs: dict[str, str], metrics: dict[str, float],
            ranked_by: str) -> dict[str, str]:
    """Tag each evaluated registered version with its `ranked_by` score (`eval.metric`), move `champion`
    where it won, and log the plots to the eval run. Returns `{registered model: version}` for each
    champion moved."""
    scored = []
    for model, identity in model_inputs(inputs).items():
        key = f"{model}/{ranked_by}"
        if key in metrics:
            ref = ArtifactRef.parse(identity)
            scored.append((ref.name, ref.run_id, metrics[key]))
    moved = registry.promote_champions(client, scored, ranked_by, eval_run_id)
    models = per_model(metrics, inputs)
    if models:
        client.log_figure(eval_run_id, metrics_figure(models, ranked_by), PLOT)
    if "rl_model" in inputs:
        rl_run = ArtifactRef.parse(inputs["rl_model"]).run_id
        curves = {name: points for name in RL_CURVES if (points := history(client, rl_run, name))}
        if curves:
            client.log_figure(eval_run_id, curves_figure(curves), "plots/rl_curves.png")
    return moved
