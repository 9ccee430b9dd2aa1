"""How the eval stage names what it takes and what it reports: `<model>_model` inputs, `<model>/<metric>`
metrics. The flow reads them back (champions, plots, the summary) without importing the stage's torch."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

MODEL_SUFFIX = "_model"


def model_inputs(inputs: dict[str, Path]) -> dict[str, Path]:
    """`{"base": path, "sft": path, ...}` in pipeline order."""
    return {name.removesuffix(MODEL_SUFFIX): path for name, path in inputs.items() if name.endswith(MODEL_SUFFIX)}


def per_model(metrics: dict[str, float], inputs: Iterable[str]) -> dict[str, dict[str, float]]:
    """The stage's flat `{"sft/accuracy": 0.9}` metrics back as `{"sft": {"accuracy": 0.9}}` for the models
    among its input names, in their order. Another `a/b` metric on its run (the flow's `time/compute_s`)
    is no model's."""
    models: dict[str, dict[str, float]] = {name.removesuffix(MODEL_SUFFIX): {} for name in inputs
                                           if name.endswith(MODEL_SUFFIX)}
    for key, value in metrics.items():
        model, sep, metric = key.partition("/")
        if sep and model in models:
            models[model][metric] = value
    return {model: values for model, values in models.items() if values}
