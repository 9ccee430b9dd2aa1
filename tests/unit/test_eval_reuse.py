"""Which earlier eval run's scores a model may take (flows/eval_reuse.py): the newest complete run with
the same scoring key that scored the same checkpoint under that model's name; nothing else."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from artifacts import run_tags, store
from flows import eval_reuse

pytestmark = pytest.mark.slow  # a SQLite MLflow store: `pytest -m "not slow"` leaves it out


@pytest.fixture
def tracking(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client, client.create_experiment("e", artifact_location=(tmp_path / "artifacts").as_uri())


def eval_run(client, experiment, tmp_path, key: str, models: dict[str, str], status: str = run_tags.COMPLETE) -> str:
    """An eval run with scoring key `key` that scored `models` (name -> checkpoint identity)."""
    run = client.create_run(experiment, tags={eval_reuse.SCORING_TAG: key, run_tags.TAG_STATUS: status,
                                              **{f"{run_tags.TAG_INPUT_PREFIX}{m}_model": ident for m, ident in models.items()}}).info.run_id
    report = tmp_path / run / "eval_report"
    report.mkdir(parents=True)
    for model in models:
        client.log_metric(run, f"{model}/accuracy", 0.5)
        (report / f"samples_{model}.jsonl").write_text(json.dumps({"prompt": "p", "response": run}) + "\n")
    client.log_artifacts(run, str(report), "eval_report")
    return run


def test_a_model_takes_the_newest_scores_of_the_same_checkpoint_under_the_same_key(tracking, tmp_path):
    client, experiment = tracking
    sft, dpo_old, dpo_new = "runs:/s1/sft_model", "runs:/d1/dpo_model", "runs:/d2/dpo_model"
    older = eval_run(client, experiment, tmp_path, "k1", {"sft": sft, "dpo": dpo_old})
    newer = eval_run(client, experiment, tmp_path, "k1", {"sft": sft, "dpo": dpo_old})
    eval_run(client, experiment, tmp_path, "k2", {"sft": sft, "dpo": dpo_new})  # other data, reward or settings
    eval_run(client, experiment, tmp_path, "k1", {"sft": sft, "dpo": dpo_new}, status="failed")  # never finished
    inputs = {"sft_model": store.ArtifactRef.parse(sft), "dpo_model": store.ArtifactRef.parse(dpo_new),
              "eval_data": store.ArtifactRef.parse("runs:/p1/eval_data")}
    found = eval_reuse.prior_results(client, experiment, "k1", inputs)
    assert set(found) == {"sft"}  # the DPO checkpoint is new: scored again
    assert found["sft"]["run_id"] == newer != older
    assert found["sft"]["metrics"] == {"accuracy": 0.5}
    assert found["sft"]["samples"] == [{"prompt": "p", "response": newer}]
    assert eval_reuse.non_model_inputs(inputs) == {"eval_data": inputs["eval_data"]}
