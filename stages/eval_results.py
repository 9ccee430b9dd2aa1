"""How the eval stage names what it takes and what it reports: `<model>_model` inputs, `<model>/<metric>`
metrics. The flow reads them back (champions, plots, the summary) without importing the stage's torch."""

from __future__ import annotations

from pathlib import Path

MODEL_SUFFIX = "_model"


def model_inputs(inputs: dict[str, Path]) -> dict[str, Path]:
    """`{"base": path, "sft": path, ...}` in pipeline order."""
    return {name.removesuffix(MODEL_SUFFIX): path for name, path in inputs.items() if name.endswith(MODEL_SUFFIX)}


def per_model(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """The stage's flat `{"sft/accuracy": 0.9}` metrics back as `{"sft": {"accuracy": 0.9}}`, in order."""
    models: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        model, sep, metric = key.partition("/")
        if sep:
            models.setdefault(model, {})[metric] = value
    return models
