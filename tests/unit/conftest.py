"""A real MLflow SQLite store in a temp folder, and stage runs published into it."""

import shutil

import pytest
from mlflow import MlflowClient
from mlflow.entities import RunStatus

from artifacts import run_tags, store


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory):
    """An MLflow SQLite file with its tables made, once: each test copies it (making them takes seconds)."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def client(tmp_path, monkeypatch, empty_store):
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    c = MlflowClient(uri)
    c.exp = c.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    return c


def stage_run(client, tmp_path, fingerprint="fp1", finish=True, publish=True, register=False, artifact="sft_model"):
    """A run of a stage that outputs `artifact` (a one-file checkpoint), published and finished as asked."""
    run = client.create_run(client.exp, tags={run_tags.TAG_STAGE: "sft", run_tags.TAG_FINGERPRINT: fingerprint})
    out = tmp_path / f"out-{run.info.run_id}" / artifact
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    if publish:
        store.publish(client, run.info.run_id, {artifact: out}, register=(artifact,) if register else ())
    if finish:
        client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run.info.run_id


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny arithmetic task's tokenizer (digits, operators, chat markers), for the multi-turn agent tests."""
    from stages.data_prep.synthetic_task import ANSWER_PREFIX  # the tiny task's vocabulary: digits, operators, markers
    from stages.data_prep.tiny_model import train_tokenizer
    from tests.unit.agent_helpers import PROMPT

    return train_tokenizer([PROMPT, f"7+14=21\n21-9=12\n{ANSWER_PREFIX}12", "Compute 0123456789+-="], vocab_size=200)
