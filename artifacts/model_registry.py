"""The MLflow model side of the store: each checkpoint a stage makes is a logged model of the experiment
(its Models tab: stage, fingerprint, data and config digests, the metrics it reached), and the registered
ones get a new version of one registered model per stage output (`rlhf-sft`, `rlhf-reward`, ...) pointing
at the checkpoint folder, with a description and tags saying where it came from. The eval stage moves the
`champion` alias to the version that beats the other versions scored on `eval.metric` (held-out).

`models:/<name>/latest` (MLflow's reserved name, not an alias) is always the newest version.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.entities import LoggedModelOutput, Metric
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS, MLFLOW_RUN_NOTE

from artifacts import tracking
from configs.redaction import logged

MODEL_PREFIX = "rlhf-"
CHAMPION = "champion"
TAG_EVAL_PREFIX = "rlhf.eval."  # version tags: the eval metric the version scored and the eval run
TAG_VERDICT = "rlhf.eval.verdict"  # version tag: how the version fared against the other versions scored
MODEL_TYPE = "rlhf-checkpoint"
# what a checkpoint takes and gives, for the version's Schema (the folder holds no MLflow flavor: it is a
# plain HF checkpoint, loaded with `from_pretrained`)
POLICY_IO = ([{"type": "string", "name": "prompt"}], [{"type": "string", "name": "response"}])
SIGNATURES = {"reward_model": ([{"type": "string", "name": "text"}], [{"type": "double", "name": "reward"}]),
              "prm": ([{"type": "string", "name": "text"}],
                      [{"type": "array", "items": {"type": "double"}, "name": "step_rewards"}]),
              # RL's critic: a value per token (AutoModelForTokenClassification), the last one as a reward model reads it
              "critic_model": ([{"type": "string", "name": "text"}],
                               [{"type": "array", "items": {"type": "double"}, "name": "values"}])}
PLAIN_CHECKPOINT = ("config.json", "adapter_config.json")  # a folder that is one checkpoint (merged_models is several)


@dataclass(frozen=True)
class CheckpointInfo:
    """Where a stage's checkpoints came from: what the logged model and registered version record."""

    experiment_id: str
    stage: str
    summary: str  # what the stage makes (stages.dag.declaration)
    fingerprint: str
    config: dict  # the stage's config keys and their values
    pipeline_run: str
    data: dict[str, str] = field(default_factory=dict)  # {"sft_data/train": digest}
    parents: dict[str, str] = field(default_factory=dict)  # model inputs: {"sft_model": "runs:/<run>/sft_model"}

    @property
    def config_digest(self) -> str:
        return hashlib.sha256(json.dumps(self.config, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def tags(self) -> dict[str, str]:
        return {"rlhf.stage": self.stage, "rlhf.fingerprint": self.fingerprint, "rlhf.config_digest": self.config_digest,
                "rlhf.pipeline_run": self.pipeline_run, **{f"rlhf.data.{k}": v for k, v in self.data.items()},
                **{f"rlhf.parent.{k}": v for k, v in self.parents.items()}}

    def description(self, artifact: str, run_id: str) -> str:
        """Markdown with links to the runs (the MLflow UI's routes live after `#`)."""
        def run(run_id: str, text: str) -> str:
            return f"[{text}](#/experiments/{self.experiment_id}/runs/{run_id})"

        lines = [f"`{artifact}` from stage **{self.stage}**: {self.summary}.", "",
                 f"- made by stage run {run(run_id, run_id[:8])} of pipeline run {run(self.pipeline_run, self.pipeline_run[:8])}",
                 f"- fingerprint `{self.fingerprint}`, config digest `{self.config_digest}`"]
        if self.data:
            lines.append("- data: " + ", ".join(f"`{name}` ({digest})" for name, digest in self.data.items()))
        if self.parents:
            lines.append("- from: " + ", ".join(f"`{name}` = {run(identity.removeprefix('runs:/').split('/')[0], identity)}"
                                               for name, identity in self.parents.items()))
        return "\n".join(lines) + "\n"


def registered_description(artifact: str, stage: str, summary: str) -> str:
    return (f"`{artifact}` checkpoints of the **{stage}** stage: {summary}. Each version is a plain HF folder "
            "(`from_pretrained` loads it); its description and tags name the data, config, fingerprint and "
            "pipeline run that made it; `@champion` is the version that beat the others on the held-out eval.")


def write_mlmodel(folder: Path, artifact: str, run_id: str, model_id: str | None, info: CheckpointInfo,
                  checkpoint_files: set[str] | None = None) -> bool:
    """An `MLmodel` file in a single checkpoint folder: no flavor (the folder stays a plain HF checkpoint),
    the signature of what it takes and gives, and its origin as metadata: the registry's Schema reads it.
    Returns whether it wrote one (a folder of several checkpoints, `merged_models`, gets none).
    `checkpoint_files`: the checkpoint's file names, where the folder is not the checkpoint's own."""
    from mlflow.models import Model
    from mlflow.models.signature import ModelSignature
    from mlflow.types import Schema

    names = checkpoint_files if checkpoint_files is not None else {p.name for p in folder.iterdir() if p.is_file()}
    if not names & set(PLAIN_CHECKPOINT):
        return False
    inputs, outputs = SIGNATURES.get(artifact, POLICY_IO)
    signature = ModelSignature(Schema.from_json(json.dumps(inputs)), Schema.from_json(json.dumps(outputs)))
    Model(artifact_path=artifact, run_id=run_id, model_id=model_id, signature=signature,
          metadata={"format": "huggingface", **info.tags()}).save(str(folder / "MLmodel"))
    return True


def log_checkpoint(client: MlflowClient, info: CheckpointInfo, artifact: str, run_id: str):
    """The logged model of one checkpoint (PENDING until `finish_checkpoint`), an output of its run."""
    model = client.create_logged_model(info.experiment_id, name=artifact, source_run_id=run_id, model_type=MODEL_TYPE,
                                       tags={**info.tags(), MLFLOW_RUN_NOTE: info.description(artifact, run_id)},
                                       params={k: logged(v) for k, v in info.config.items()})
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, 0)])
    return model


def link_metrics(client: MlflowClient, run_id: str, model_id: str, names: list[str], dataset=None) -> None:
    """Attach the last point of each of the run's `names` series to the logged model (and, where given, the
    dataset it was measured on), for the Models tab: logged again unchanged, the run keeps one point."""
    linked = []
    for name in names:
        history = client.get_metric_history(run_id, name)
        if history:
            last = max(history, key=lambda m: (m.step, m.timestamp))
            linked.append(Metric(name, last.value, last.timestamp, last.step, model_id=model_id,
                                 dataset_name=dataset.name if dataset else None,
                                 dataset_digest=dataset.digest if dataset else None))
    if linked:
        client.log_batch(run_id, metrics=linked)


def registered_name(artifact: str) -> str:
    """`sft_model` -> `rlhf-sft`, `reward_model` -> `rlhf-reward`, `prm` -> `rlhf-prm`."""
    return MODEL_PREFIX + artifact.removesuffix("_model").replace("_", "-")


def register_model(client: MlflowClient, name: str, source: str, run_id: str, info: CheckpointInfo | None = None,
                   model_id: str | None = None):
    """A new version of `name` pointing at the logged checkpoint directory; with `info`, described and
    tagged with where it came from and linked to its logged model (`model_id`)."""
    artifact = source.rstrip("/").rsplit("/", 1)[-1]
    description = registered_description(artifact, info.stage, info.summary) if info is not None else None
    try:
        current = client.get_registered_model(name)
        if description is not None and current.description != description:
            client.update_registered_model(name, description=description)
    except mlflow.exceptions.MlflowException:
        with contextlib.suppress(mlflow.exceptions.MlflowException):  # created concurrently
            client.create_registered_model(name, description=description)
    if info is None:
        return client.create_model_version(name, source=source, run_id=run_id)
    # a tracking server takes a version's `model_id` only with a source inside that logged model's own
    # artifacts; the weights stay in the run, so there the version names its run alone (the logged model
    # still lists the version, below)
    linked = None if tracking.is_server(client.tracking_uri) else model_id
    version = client.create_model_version(name, source=source, run_id=run_id, model_id=linked, tags=info.tags(),
                                          description=info.description(artifact, run_id))
    if model_id is not None:  # the logged model's "Model versions" (what `mlflow.register_model` records)
        client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps([{"name": name, "version": version.version}])})
    return version


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


def contest(scores: dict[str, float], current: str | None, metric: str) -> tuple[str | None, dict[str, str]]:
    """The champion among the versions scored on `metric` (`{version: score}`), and a verdict per version.
    A version is champion only where it beats every other one: one version alone is no contest, and a tie
    at the top keeps the current champion if it is among the leaders (else there is none)."""
    if len(scores) < 2:
        return None, {v: f"no contest: the only version scored on {metric}" for v in scores}
    scores = dict(sorted(scores.items(), key=lambda item: (len(item[0]), item[0])))  # version numbers in order
    best = max(scores.values())
    leaders = [v for v, score in scores.items() if score == best]
    champion = leaders[0] if len(leaders) == 1 else (current if current in leaders else None)
    verdicts = {}
    for version, score in scores.items():
        others = ", ".join(v for v in scores if v != version)
        if version == champion and len(leaders) == 1:
            verdicts[version] = f"champion: beats version(s) {others} on {metric}"
        elif score == best:
            verdicts[version] = f"tied on {metric} with version(s) {', '.join(v for v in leaders if v != version)}"
        else:
            verdicts[version] = f"behind version(s) {', '.join(leaders)} on {metric} ({score:.4g} < {best:.4g})"
    return champion, verdicts


def current_champion(client: MlflowClient, name: str) -> str | None:
    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except mlflow.exceptions.MlflowException:
        return None


def promote_champions(client: MlflowClient, scored: list[tuple[str, str, float]], metric: str,
                      eval_run_id: str) -> dict[str, tuple[str, str]]:
    """For each evaluated stage output `(artifact, run_id, score)`: tag its registered version with the
    score, then hold the contest among every version of that registered model scored on `metric`
    (`contest`): `champion` moves to the winner, and each version scored now gets its verdict as a tag.
    Returns `{registered name: (version, verdict)}` for the versions scored now."""
    verdicts: dict[str, tuple[str, str]] = {}
    for artifact, run_id, score in scored:
        for version in versions_of(client, artifact, run_id):
            client.set_model_version_tag(version.name, version.version, TAG_EVAL_PREFIX + metric, str(score))
            client.set_model_version_tag(version.name, version.version, TAG_EVAL_PREFIX + "run", eval_run_id)
            scores = {str(v.version): float(v.tags[TAG_EVAL_PREFIX + metric])
                      for v in client.search_model_versions(f"name = '{version.name}'") if TAG_EVAL_PREFIX + metric in v.tags}
            scores[str(version.version)] = score  # the tag just set, whatever the search saw
            current = current_champion(client, version.name)
            champion, said = contest(scores, current, metric)
            if champion is not None and champion != current:
                client.set_registered_model_alias(version.name, CHAMPION, champion)
            client.set_model_version_tag(version.name, version.version, TAG_VERDICT, said[str(version.version)])
            verdicts[version.name] = (str(version.version), said[str(version.version)])
    return verdicts
