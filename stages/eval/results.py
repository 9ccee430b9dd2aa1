"""How the eval stage names what it takes and what it reports: `<model>_model` inputs, `<model>/<metric>`
metrics. The flow reads them back (champions, plots, the summary) without importing the stage's torch."""

from __future__ import annotations

from collections.abc import Iterable

from configs.reward_sources import own_models

MODEL_SUFFIX = "_model"
REWARD_INPUTS = own_models()  # the pipeline's own RM / PRM when they are the reward: scorers, not models
SCORE = "score"  # the stage's key metric: the last model's `eval.metric`, whichever metric the config picks


def model_inputs(inputs: dict) -> dict:
    """`{"base": path, "sft": path, ...}` in pipeline order: the policies to evaluate."""
    return {name.removesuffix(MODEL_SUFFIX): value for name, value in inputs.items()
            if name.endswith(MODEL_SUFFIX) and name not in REWARD_INPUTS}


def per_model(metrics: dict[str, float], inputs: Iterable[str]) -> dict[str, dict[str, float]]:
    """The stage's flat `{"sft/accuracy": 0.9}` metrics back as `{"sft": {"accuracy": 0.9}}` for the models
    among its input names, in their order. Another `a/b` metric on its run (the flow's `time/compute_s`)
    is no model's."""
    models: dict[str, dict[str, float]] = {model: {} for model in model_inputs(dict.fromkeys(inputs))}
    for key, value in metrics.items():
        model, sep, metric = key.partition("/")
        if sep and model in models:
            models[model][metric] = value
    return {model: values for model, values in models.items() if values}
