"""The MLflow model registry side of the store: one registered model per stage output
(`rlhf-sft`, `rlhf-reward`, ...), a new version per finished stage run, and the `champion` alias that
the eval stage moves to a version when it beats the current champion on `eval.metric` (held-out).

`models:/<name>/latest` (MLflow's reserved name, not an alias) is always the newest version.
"""

from __future__ import annotations

import mlflow
from mlflow import MlflowClient

MODEL_PREFIX = "rlhf-"
CHAMPION = "champion"
TAG_EVAL_PREFIX = "rlhf.eval."  # version tags: the eval metric the version scored and the eval run


def registered_name(artifact: str) -> str:
    """`sft_model` -> `rlhf-sft`, `reward_model` -> `rlhf-reward`, `prm` -> `rlhf-prm`."""
    return MODEL_PREFIX + artifact.removesuffix("_model").replace("_", "-")


def register_model(client: MlflowClient, name: str, source: str, run_id: str):
    """A new version of `name` pointing at the logged checkpoint directory."""
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        try:
            client.create_registered_model(name, description="Checkpoints produced by the rlhf-pipeline stage")
        except mlflow.exceptions.MlflowException:
            pass  # created concurrently
    return client.create_model_version(name, source=source, run_id=run_id)


def model_version(client: MlflowClient, model: str):
    """The version `<name>/<version>`, `<name>/latest` or `<name>@<alias>` names (MlflowException if none)."""
    if "@" in model:
        name, alias = model.split("@", 1)
        if alias.lower() != "latest":
            return client.get_model_version_by_alias(name, alias)
        model = f"{name}/latest"
    name, version = model.split("/", 1)
    if version.lower() == "latest":
        versions = client.search_model_versions(f"name = '{name}'", order_by=["version_number DESC"], max_results=1)
        if not versions:
            raise mlflow.exceptions.MlflowException(f"registered model {name!r} has no versions")
        return versions[0]
    return client.get_model_version(name, version)


def versions_of(client: MlflowClient, artifact: str, run_id: str) -> list:
    """The registered versions of one stage output (the artifact `artifact` of run `run_id`)."""
    return client.search_model_versions(f"name = '{registered_name(artifact)}' and run_id = '{run_id}'")


def champion_score(client: MlflowClient, name: str, metric: str) -> tuple[str | None, float]:
    """The current champion's version and its eval score (None, -inf without one)."""
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except mlflow.exceptions.MlflowException:
        return None, float("-inf")
    return str(current.version), float(current.tags.get(TAG_EVAL_PREFIX + metric, "-inf"))


def promote_champions(client: MlflowClient, scored: list[tuple[str, str, float]], metric: str, eval_run_id: str) -> dict[str, str]:
    """For each evaluated stage output `(artifact, run_id, score)`: tag its registered version with the
    score, and move `champion` to it when it beats the current champion (or there is none).
    Returns `{registered name: version}` for every alias moved."""
    moved = {}
    for artifact, run_id, score in scored:
        for version in versions_of(client, artifact, run_id):
            client.set_model_version_tag(version.name, version.version, TAG_EVAL_PREFIX + metric, str(score))
            client.set_model_version_tag(version.name, version.version, TAG_EVAL_PREFIX + "run", eval_run_id)
            current, best = champion_score(client, version.name, metric)
            if current != str(version.version) and score > best:
                client.set_registered_model_alias(version.name, CHAMPION, version.version)
                moved[version.name] = str(version.version)
    return moved
