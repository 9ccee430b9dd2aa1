"""Per-model reuse for the eval stage: when eval reruns because some of its models changed (a forced DPO,
a new RL run), the models whose checkpoint is the same are not scored again.

The eval stage's fingerprint covers every model it scores, so one new checkpoint reruns the stage. What
a model's scores depend on is that model and everything else the stage reads (held-out data, the
reward source and its models, the eval settings, the stage's code): the stage's fingerprint without its
model inputs, its *scoring key*, tagged on each eval run. An earlier complete eval run with the same
scoring key that scored a model from the same checkpoint (its `rlhf.input.<name>_model` tag) holds that
model's metrics and samples; they are handed to the stage (`StageContext.prior_results`), which takes
them instead of scoring the model again. Each model is scored from the same seed whatever else is
scored, so a reused score is the one a rescore would give.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mlflow import MlflowClient

from artifacts import run_tags, store
from stages.eval.results import MODEL_SUFFIX, model_inputs

SCORING_TAG = "rlhf.eval.scoring"  # the eval stage's fingerprint without its model inputs
REUSED_TAG_PREFIX = "rlhf.eval.reused."  # rlhf.eval.reused.<model> = the run whose scores were taken


def non_model_inputs(inputs: dict[str, store.ArtifactRef]) -> dict[str, store.ArtifactRef]:
    models = {f"{name}{MODEL_SUFFIX}" for name in model_inputs(inputs)}
    return {name: ref for name, ref in inputs.items() if name not in models}


def prior_results(client: MlflowClient, experiment_id: str, scoring_key: str,
                  inputs: dict[str, store.ArtifactRef]) -> dict[str, dict]:
    """`{model: {"run_id", "metrics", "samples"}}` for each model an earlier complete eval run with this
    scoring key scored from the same checkpoint (the newest such run)."""
    runs = client.search_runs([experiment_id], f"tags.`{SCORING_TAG}` = '{scoring_key}' and "
                              f"tags.`{run_tags.TAG_STATUS}` = '{run_tags.COMPLETE}'", order_by=["attributes.start_time DESC"])
    found: dict[str, dict] = {}
    for name in model_inputs(inputs):
        identity = inputs[f"{name}{MODEL_SUFFIX}"].identity
        for run in runs:
            metrics = {k.removeprefix(f"{name}/"): v for k, v in run.data.metrics.items() if k.startswith(f"{name}/")}
            if run.data.tags.get(f"{run_tags.TAG_INPUT_PREFIX}{name}{MODEL_SUFFIX}") == identity and metrics:
                found[name] = {"run_id": run.info.run_id, "metrics": metrics, "samples": samples(client, run.info.run_id, name)}
                break
    return found


def samples(client: MlflowClient, run_id: str, model: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(run_id, f"eval_report/samples_{model}.jsonl", tmp)
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
