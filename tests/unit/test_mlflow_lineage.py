"""What the MLflow UI reads of where things came from: datasets as run inputs, checkpoints as logged models
and described, tagged versions, and a reused stage shown under the pipeline run that reused it."""

import json
import shutil

import yaml
from mlflow.entities import Metric, RunStatus

from artifacts import datasets, run_tags, store
from artifacts import model_registry as registry
from artifacts.store import ArtifactRef
from flows import run_views
from tests.unit.conftest import stage_run

PAIR = {"prompt": "p", "chosen": "a", "rejected": "b", "margin": 0.5}


def write_manifest(folder, entries):
    """What data prep writes beside its splits (stages/data/prepared.py), by hand."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / datasets.MANIFEST).write_text(json.dumps(entries))


def test_each_split_is_a_dataset_with_its_context_digest_rows_and_columns_from_the_manifest(tmp_path):
    folder = tmp_path / "pref_data"
    write_manifest(folder, {"train": {"rows": 3, "sha256": "ab" * 32, "first": PAIR},
                            "eval": {"rows": 1, "sha256": "cd" * 32, "first": {**PAIR, "margin": 0.0}}})
    ref = ArtifactRef("pref_data", "r1")
    found = datasets.dataset_inputs({"pref_data": folder}, {"pref_data": ref}, {"pref_data": folder.as_uri()})
    by_context = {datasets.context(i): i.dataset for i in found}
    assert set(by_context) == {"train", "eval"}
    train = by_context["train"]
    assert train.name == "pref_data" and train.digest == "abababab" and by_context["eval"].digest == "cdcdcdcd"
    assert json.loads(train.profile) == {"num_rows": 3} and json.loads(by_context["eval"].profile) == {"num_rows": 1}
    assert [c["name"] for c in json.loads(train.schema)["mlflow_colspec"]] == ["prompt", "chosen", "rejected", "margin"]
    assert train.source_type == "local" and json.loads(train.source)["uri"] == (folder / "train").as_uri()
    assert datasets.digests(found) == {"pref_data/train": "abababab", "pref_data/eval": "cdcdcdcd"}
    # an artifact store no MLflow dataset source reads: the runs:/ URI that loads it
    again = next(i for i in datasets.dataset_inputs({"pref_data": folder}, {"pref_data": ref}, {"pref_data": "mlflow-artifacts:/x"})
                 if datasets.context(i) == "train")
    assert again.dataset.source_type == datasets.RUN_ARTIFACT_SOURCE
    assert json.loads(again.dataset.source) == {"uri": "runs:/r1/pref_data/train"}
    assert datasets.dataset_inputs({"pref_data": tmp_path / "none"}, {"pref_data": ref}, {"pref_data": "x"}) == []


def test_the_driver_fetches_a_datasets_manifest_alone_and_once(client, tmp_path):
    """On a tracking server the driver reads digests from the manifest, never the Arrow files beside it."""
    folder = tmp_path / "out" / "sft_data"
    write_manifest(folder, {"train": {"rows": 2, "sha256": "ef" * 32, "first": {"texts": ["q", "a"], "train": [False, True]}}})
    (folder / "train").mkdir()
    (folder / "train" / "data-00000-of-00001.arrow").write_bytes(b"\0" * 100_000)
    run = client.create_run(client.exp).info.run_id
    client.log_artifacts(run, str(folder), "sft_data")
    ref = ArtifactRef("sft_data", run)
    got = datasets.fetch_manifest(client, ref, tmp_path / "manifests")
    assert got == tmp_path / "manifests" / run / "sft_data" and [p.name for p in got.rglob("*")] == [datasets.MANIFEST]
    (found,) = datasets.dataset_inputs({"sft_data": got}, {"sft_data": ref}, {"sft_data": "mlflow-artifacts:/x"})
    assert found.dataset.digest == "efefefef" and json.loads(found.dataset.profile) == {"num_rows": 2}
    shutil.rmtree(tmp_path / "art")  # the store's copy gone: the fetched manifest is read, not fetched again
    assert datasets.fetch_manifest(client, ref, tmp_path / "manifests") == got


def test_a_registered_checkpoint_is_a_logged_model_whose_version_says_where_it_came_from(client, tmp_path):
    run = client.create_run(client.exp).info.run_id
    client.log_batch(run, metrics=[Metric("eval/loss", v, 1000 + s, s) for s, v in ((5, 0.9), (10, 0.5))])
    out = tmp_path / "sft_model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    info = registry.CheckpointInfo(client.exp, "sft", "the SFT policy", "fp123", {"sft.lr": 0.002}, "parent9",
                                   data={"sft_data/train": "abcd1234"}, parents={"base_model": "runs:/d1/base_model"})
    eval_split = datasets.Dataset(name="sft_data", digest="ef567890", source_type="local", source="{}")
    store.publish(client, run, {"sft_model": out}, ("sft_model",), info, linked=(["eval/loss"], eval_split))

    (model,) = client.search_logged_models([client.exp])
    assert (model.name, model.source_run_id, model.status.to_proto()) == ("sft_model", run, 2)  # READY
    assert model.tags["rlhf.fingerprint"] == "fp123" and model.params == {"sft.lr": "0.002"}
    assert [(m.key, m.value, m.step, m.dataset_digest) for m in model.metrics] == [("eval/loss", 0.5, 10, "ef567890")]
    assert [m.step for m in client.get_metric_history(run, "eval/loss")] == [5, 10]  # linked, not logged twice
    assert [o.model_id for o in client.get_run(run).outputs.model_outputs] == [model.model_id]
    assert json.loads(model.tags["mlflow.modelVersions"]) == [{"name": "rlhf-sft", "version": 1}]

    version = client.get_model_version("rlhf-sft", "1")
    assert version.tags == {"rlhf.stage": "sft", "rlhf.fingerprint": "fp123", "rlhf.config_digest": info.config_digest,
                            "rlhf.pipeline_run": "parent9", "rlhf.data.sft_data/train": "abcd1234",
                            "rlhf.parent.base_model": "runs:/d1/base_model"}
    assert f"(#/experiments/{client.exp}/runs/parent9)" in version.description and "abcd1234" in version.description
    assert "SFT policy" in client.get_registered_model("rlhf-sft").description
    # the folder holds the schema the registry shows, no flavor: it stays a plain HF checkpoint
    mlmodel = yaml.safe_load((out / "MLmodel").read_text())
    assert mlmodel["flavors"] == {} and mlmodel["model_id"] == model.model_id
    assert [a.path for a in client.list_logged_model_artifacts(model.model_id)] == ["MLmodel"]  # not the weights again
    assert json.loads(mlmodel["signature"]["inputs"])[0]["name"] == "prompt"


def test_a_reused_stage_shows_under_the_pipeline_run_that_reused_it(client, tmp_path):
    made = stage_run(client, tmp_path)
    client.log_batch(made, metrics=[Metric("eval/loss", 0.5, 0, 10), Metric("train/loss", 0.4, 0, 10)])
    parent = client.create_run(client.exp).info.run_id
    child = run_views.record_reuse(client, client.exp, parent, "sft", client.get_run(made))
    run = client.get_run(child)
    assert run.info.run_name == "sft · cached" and run.info.status == RunStatus.to_string(RunStatus.FINISHED)
    assert run.data.tags[run_tags.TAG_PARENT] == parent and run.data.tags[run_views.TAG_REUSED] == made
    assert run_tags.TAG_STAGE not in run.data.tags  # nobody's cache entry
    assert run.data.metrics == {"eval/loss": 0.5}
    assert f"(#/experiments/{client.exp}/runs/{made})" in run.data.tags["mlflow.note.content"]


def test_data_prep_reads_the_files_or_hub_datasets_its_config_names_or_the_synthetic_task(tmp_path):
    from configs import load_config

    synthetic = datasets.config_sources(load_config(None, []).data, 42)
    assert [(i.dataset.name, datasets.context(i)) for i in synthetic] == [("synthetic", "synthetic")]
    assert datasets.config_sources(load_config(None, ["data.synthetic.num_train=10"]).data, 42)[0].dataset.digest != synthetic[0].dataset.digest
    assert datasets.config_sources(load_config(None, []).data, 7)[0].dataset.digest != synthetic[0].dataset.digest
    sft = tmp_path / "sft.jsonl"
    sft.write_text('{"input": "q", "output": "a"}\n')
    cfg = load_config(None, ["data.source=files", f"data.sft.paths=[{sft}]", "data.prompts.paths=[openai/gsm8k]",
                             "data.prompts.subset=main"])
    found = {(i.dataset.name, datasets.context(i)): i.dataset for i in datasets.config_sources(cfg.data, 42)}
    assert set(found) == {("sft.jsonl", "sft"), ("openai/gsm8k", "prompts")}
    assert found["sft.jsonl", "sft"].source_type == "local"
    assert found["openai/gsm8k", "prompts"].source_type == "hugging_face"
    before = found["sft.jsonl", "sft"].digest
    sft.write_text('{"input": "q", "output": "b"}\n')  # a file's content, not its name, is its digest
    assert datasets.config_sources(cfg.data, 42)[0].dataset.digest != before


def test_rlhf_compare_reads_key_metrics_under_the_scheme_and_in_runs_made_before_it(client):
    from flows.cli.runs import comparison

    old, new = (client.create_run(client.exp).info.run_id for _ in range(2))
    client.log_batch(old, metrics=[Metric("eval_loss", 0.25, 0, 0)])
    client.log_batch(new, metrics=[Metric("eval/loss", 0.5, 0, 10)])
    parents = []
    for sft in (old, new):
        parents.append(client.create_run(client.exp, tags={"rlhf.kind": "pipeline", "stage.sft": f"ran {sft}"}).info.run_id)
    rows = comparison(client, parents)
    assert rows["sft: eval/loss"] == {parents[0]: "0.25 (ran)", parents[1]: "0.5 (ran)"}
