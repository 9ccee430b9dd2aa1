"""The tiny pipeline end to end through the real CLI, as one scenario on one MLflow store (its first run and
the identical rerun are module fixtures, so each test also passes alone):

1. killed during SFT, then re-run: SFT resumes from its last checkpoint, nothing half-written is published
2. the SFT model beats the base model on held-out accuracy; the GRPO policy beats the SFT model
   on sampled held-out accuracy, and so does DPO; PPO on the pipeline's PRM raises its reward with bounded KL;
   iterative DPO's own samples get better round by round
3. the MLflow store holds the runs, params, loss curves and a loadable registered checkpoint
4. a second identical run is all cached; `--force dpo` reruns DPO though nothing changed, and eval
   follows it
5. `--only eval` with an input pinned to another stage's checkpoint runs just eval on it, without the
   pinned input's producer, on the `ray start --head` cluster named by `infra.ray_address`
6. `rlhf serve` serves rlhf-pipeline/full and /stage; `prefect deployment run rlhf-pipeline/stage` with a
   changed RM setting runs the RM on the cached stages it needs; a full run with a bad reward file fails at
   the checks `rlhf run` makes, before any stage
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import mlflow
import pytest
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
from transformers import AutoModelForCausalLM, AutoTokenizer

import configs
from artifacts import run_tags, store
from tests.flow.conftest import (
    CLI,
    as_a_cli_process,
    assert_gone,
    cli_env,
    cluster_processes,
    main_in_process,
    mlflow_client,
    run_cli,
)
from tests.flow.kill_chain import KILLED_STAGES, kill_points, killed_again_and_again

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first test pays the module's whole first run
PREFECT = str(Path(sys.executable).parent / "prefect")


@pytest.fixture(scope="module")
def ws(tmp_path_factory, prefect_server):
    return tmp_path_factory.mktemp("pipeline")


OFF_IN_THE_PRESET = ("rs", "kd", "csft")  # training methods the tiny preset leaves off: skipped in every run here


def newest_pipeline_run(ws):
    client = mlflow_client(ws)
    exp = client.get_experiment_by_name("rlhf-pipeline")
    return client.search_runs([exp.experiment_id], "tags.`rlhf.kind` = 'pipeline'", order_by=["attributes.start_time DESC"])[0]


def stage_statuses(ws) -> dict[str, str]:
    """`{"sft": "ran", ...}` from the newest pipeline run's tags, less the stages the preset leaves off."""
    parent = newest_pipeline_run(ws)
    statuses = {k.removeprefix("stage."): v.split()[0] for k, v in parent.data.tags.items() if k.startswith("stage.")}
    for name in OFF_IN_THE_PRESET:
        assert statuses.pop(name, "skipped") == "skipped", name
    return statuses


def stage_runs(ws, stage: str):
    client = mlflow_client(ws)
    exp = client.get_experiment_by_name("rlhf-pipeline")
    return client.search_runs([exp.experiment_id], f"tags.`rlhf.stage` = '{stage}'")


@pytest.fixture(scope="module")
def first_run(ws) -> dict:
    """The scenario every other test builds on, run once per module (so any test also runs alone, and in any
    order): `rlhf run` killed during SFT, what the kill left, the rerun that finishes the pipeline, and an
    identical run after it, all cached. The ids of what they made are kept here, so a test finds them
    whatever the tests before it added to the store."""
    proc = subprocess.Popen([*CLI, "run"], cwd=ws, env=cli_env(ws), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    latest = None
    while time.monotonic() < deadline and latest is None:
        found = list((ws / ".rlhf" / "work").glob("sft-*/checkpoints/latest"))
        latest = found[0] if found else None
        time.sleep(0.5)
    assert latest is not None, "SFT never wrote a checkpoint"
    cluster = cluster_processes(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    seen = {"cli_pid": proc.pid, "cluster_groups": {pgid for _, pgid in cluster.values()}}
    try:
        assert_gone(cluster, within_s=2)
        seen["left_alive"] = []
    except AssertionError as left:
        seen["left_alive"] = str(left)
    sft_runs = stage_runs(ws, "sft")
    seen["killed_sft_runs"] = [r.data.tags.get(run_tags.TAG_STATUS) for r in sft_runs]
    seen["killed_sft_versions"] = mlflow_client(ws).search_model_versions("name = 'rlhf-sft'")
    with as_a_cli_process(ws):  # in this process: what the rerun checks is not a process's start
        seen["rerun"] = main_in_process("run")  # the rest of SFT and every other stage of the preset
    seen["statuses"] = stage_statuses(ws)
    seen["cold_parent"] = newest_pipeline_run(ws).info.run_id
    seen["complete"] = {stage: [r.info.run_id for r in stage_runs(ws, stage) if r.data.tags.get(run_tags.TAG_STATUS) == run_tags.COMPLETE]
                        for stage in ("sft", "rm", "prm", "rl", "dpo", "eval")}
    seen["sft_runs_before_cached"] = len(stage_runs(ws, "sft"))
    with as_a_cli_process(ws):
        seen["cached"] = main_in_process("run")
    seen["cached_statuses"] = stage_statuses(ws)
    seen["cached_parent"] = newest_pipeline_run(ws).info.run_id
    seen["sft_runs_after_cached"] = len(stage_runs(ws, "sft"))
    return seen


def made(ws, first_run, stage: str):
    """The one complete run of `stage` the first run made."""
    (run_id,) = first_run["complete"][stage]
    return mlflow_client(ws).get_run(run_id)


def versions_of(ws, name: str, run) -> list:
    return mlflow_client(ws).search_model_versions(f"name = '{name}' and run_id = '{run.info.run_id}'")


@pytest.fixture
def workdir(ws) -> Path:
    """The `cli` fixture's folder here: the module's store."""
    return ws


@pytest.fixture
def in_process(cli, monkeypatch, prefect_server):
    """`rlhf ARGS` in this process (`cli`), from the module's folder and reporting to the tests' shared Prefect
    server: a run whose process start is not what its test checks, without the seconds of interpreter start
    and imports a subprocess pays. The stop, kill and fault tests run the CLI as a process of its own."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    return cli


def test_killed_during_sft_then_resumed(first_run):
    # the local Ray cluster is the run's process group: its workers too, not in groups of their own
    assert first_run["cluster_groups"] == {first_run["cli_pid"]}
    assert first_run["left_alive"] == []  # killed with the group, not left to notice their raylet died
    # nothing of the killed SFT is published: no complete run, no registered version
    assert first_run["killed_sft_runs"] and run_tags.COMPLETE not in first_run["killed_sft_runs"]
    assert first_run["killed_sft_versions"] == []
    result = first_run["rerun"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "[sft] resumed from step" in result.stdout
    # the first eval crowns no model (one version each: no contest); the summary's lineage names each stage's sources
    assert "[eval] rlhf-sft version 1: no contest: the only version scored on reward" in result.stdout
    assert "inputs from" in result.stdout
    assert first_run["statuses"] == {"data_prep": "cached", "sft": "ran", "rm": "ran", "prm": "ran", "rl": "ran",
                                     "dpo": "ran", "lora_merge": "skipped", "eval": "ran"}


# what may differ between two runs of the same code: when and how fast things ran, and the machine's own readings
UNTIMED = ("time/", "system/")


def timing(metric: str) -> bool:
    return metric.startswith(UNTIMED) or metric.rsplit("/", 1)[-1].endswith(("_s", "per_s"))


def output_digests(client, run) -> dict[str, str]:
    """Every file a stage run's artifacts hold, by path, and its SHA-256; not MLflow's `MLmodel` record of a
    logged model (its run, its inputs' runs, when it was logged: this store's ids and times, not the stage's work)."""
    import hashlib

    root = Path(run.info.artifact_uri.removeprefix("file://"))
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(root.rglob("*")) if f.is_file() and f.name != "MLmodel"}


def histories(client, run) -> dict[str, list[tuple[int, float]]]:
    return {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for key in sorted(run.data.metrics) if not timing(key)}


@pytest.fixture(scope="module")
def clean_run(ws, first_run, tmp_path_factory) -> Path:
    """The same `rlhf run` in a fresh folder, never interrupted."""
    fresh = tmp_path_factory.mktemp("uninterrupted")
    with as_a_cli_process(fresh):
        done = main_in_process("run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return fresh


PIPELINE_STAGES = ("data_prep", "sft", "rm", "prm", "rl", "dpo", "eval")


def since_resume(got: dict, want: dict) -> tuple[dict, dict]:
    """A stage run's metric histories (`got`) and an uninterrupted run's (`want`), as they must be equal: a resumed
    run logs every point after the step it resumed at and says which (`resumed_from_step`), and before that step
    only what it logs again (RL's held-out eval of the SFT policy at step 0, the stage's last metrics at 0)."""
    got = dict(got)
    if (resumed := got.pop("resumed_from_step", None)) is None:
        return got, want
    ((_, start),) = resumed
    assert start > 0
    kept = {}
    for key, points in want.items():
        again = {step for step, _ in got.get(key, [])}
        if since := [(step, v) for step, v in points if step > start or step in again]:
            kept[key] = since
    return got, kept


def assert_same_work(resumed_store: Path, runs: dict, clean_store: Path) -> None:
    """Each stage's run in `runs` (of `resumed_store`) against the one run of that stage in `clean_store`: every
    file of its outputs (the weights included) is the same bytes, and every metric's history the same values at
    the same steps, from where it resumed (when and how fast things ran aside)."""
    resumed, clean = mlflow_client(resumed_store), mlflow_client(clean_store)
    exp = clean.get_experiment_by_name("rlhf-pipeline")
    for stage, ours in runs.items():
        (theirs,) = clean.search_runs([exp.experiment_id], f"tags.`rlhf.stage` = '{stage}'")
        digests = output_digests(resumed, ours)
        assert digests and digests == output_digests(clean, theirs), stage
        got, want = since_resume(histories(resumed, ours), histories(clean, theirs))
        assert got == want, stage


@pytest.mark.timeout(1200)
def test_a_killed_and_resumed_run_ends_byte_identical_to_an_uninterrupted_one(ws, first_run, clean_run):
    """The first run, killed by SIGKILL during SFT and resumed from its checkpoint, against the same run in a
    fresh store, never interrupted: the same outputs and metric histories (`assert_same_work`). No tolerance: on
    one machine the pipeline is deterministic."""
    # data_prep finished before the kill: the first of its complete runs in this store
    runs = {"data_prep": min((r for r in stage_runs(ws, "data_prep") if r.data.tags.get(run_tags.TAG_STATUS) == run_tags.COMPLETE),
                             key=lambda r: r.info.start_time)}
    runs |= {stage: made(ws, first_run, stage) for stage in PIPELINE_STAGES[1:]}
    assert "resumed_from_step" in runs["sft"].data.metrics
    assert_same_work(ws, runs, clean_run)


KILL_SEED = 20261207


@pytest.mark.timeout(2700)  # alone: the module's first run and the clean run before it
def test_killed_twenty_times_across_the_stages_the_reruns_end_byte_identical(clean_run, tmp_path_factory):
    """`rlhf run` in a fresh store, SIGKILLed (its whole process group) at 20 points drawn from a seeded list
    inside the work of every stage after data prep, each kill followed by a plain rerun, which resumes each
    stage from its last checkpoint and reuses the finished ones, then a last rerun to the end: each stage's one
    complete run matches the uninterrupted run's (`assert_same_work`). After each kill no process of the
    group is left (`killed_again_and_again`)."""
    folder = tmp_path_factory.mktemp("killed")
    started = time.monotonic()
    kills = killed_again_and_again(folder, kill_points(20, KILL_SEED))
    final = run_cli(folder, "run", timeout=900)
    took = time.monotonic() - started
    print(f"20 kills and the reruns to the end: {took:.0f} s\n" + "\n".join(
        f"{i:2d}. {k.point.stage} +{k.point.delay_s:4.1f} s: hit {k.hit or 'between stages'} at step {k.step} "
        f"{k.attempt_s:5.1f} s into its attempt{', inside a checkpoint write' if k.in_checkpoint_write else ''}"
        for i, k in enumerate(kills, 1)))
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert {k.hit for k in kills} >= set(KILLED_STAGES), [k.hit for k in kills]
    runs = {}
    for stage in PIPELINE_STAGES:
        (runs[stage],) = [r for r in stage_runs(folder, stage) if r.data.tags.get(run_tags.TAG_STATUS) == run_tags.COMPLETE]
    assert_same_work(folder, runs, clean_run)


def test_sft_beats_base_on_held_out_accuracy(ws, first_run):
    eval_run = made(ws, first_run, "eval")
    base, sft = eval_run.data.metrics["base/accuracy"], eval_run.data.metrics["sft/accuracy"]
    print(f"held-out accuracy: base {base:.3f}, sft {sft:.3f}")
    assert sft >= base + 0.2


def test_grpo_beats_sft_on_sampled_held_out_accuracy(ws, first_run):
    m = made(ws, first_run, "eval").data.metrics
    print("held-out accuracy (greedy / sampled at T=1): "
          + ", ".join(f"{k} {m[f'{k}/accuracy']:.3f} / {m[f'{k}/sampled_accuracy']:.3f}" for k in ("base", "sft", "rl")))
    assert m["rl/sampled_accuracy"] >= m["sft/sampled_accuracy"] + 0.10
    assert m["rl/accuracy"] >= m["sft/accuracy"] - 0.05  # sharpening the samples does not cost greedy accuracy
    rl_run = made(ws, first_run, "rl")
    history = mlflow_client(ws).get_metric_history(rl_run.info.run_id, "train/reward")
    assert sorted(m.step for m in history) == list(range(1, 31))  # one point per rollout step of the preset


def test_dpo_beats_sft_on_sampled_held_out_accuracy_and_reports_reward_accuracy(ws, first_run):
    m = made(ws, first_run, "eval").data.metrics
    dpo_run = made(ws, first_run, "dpo")
    d = dpo_run.data.metrics
    print(f"dpo: held-out accuracy greedy {m['dpo/accuracy']:.3f} / sampled {m['dpo/sampled_accuracy']:.3f} "
          f"(sft {m['sft/accuracy']:.3f} / {m['sft/sampled_accuracy']:.3f}); eval reward accuracy {d['eval/reward_accuracy']:.3f}, "
          f"margin {d['eval/margin']:.3f}")
    assert m["dpo/sampled_accuracy"] >= m["sft/sampled_accuracy"] + 0.10
    assert m["dpo/accuracy"] >= m["sft/accuracy"] - 0.05
    assert d["eval/reward_accuracy"] >= 0.9 and d["eval/margin"] > 0
    assert {"eval/reward_accuracy", "eval/chosen_reward", "eval/rejected_reward", "train/margin"} <= set(d)
    assert len(versions_of(ws, "rlhf-dpo", dpo_run)) == 1


# PPO (critic, GAE, the KL penalty in the reward) scored by the pipeline's own PRM, per step (min of its step scores).
# The test reads the training curves, not RL's held-out evals (before step 1 and after step 9): those score 16
# greedy answers, not the preset's 200. Each rollout reseeds its sampler, so the evals leave the curves as they were.
PPO_ON_THE_PRM = ("reward.source=prm", "rl.algorithm.advantage_estimator=gae", "rl.algorithm.use_kl_loss=false",
                  "rl.algorithm.init_kl_coef=0.05", "rl.algorithm.kl_estimator=k1", "rl.max_steps=9", "rl.eval_every=9",
                  "eval.samples_per_prompt=0", "eval.max_samples=16")


def test_ppo_with_the_pipelines_prm_raises_the_reward_with_bounded_kl(ws, first_run, in_process):
    """`--only rl` with the PRM as the reward source: RL runs on the cached SFT policy and the cached PRM (the
    reward model is not needed, so it is not asked for), and PPO raises the PRM's reward."""
    result = in_process("run", "--only", "rl", *PPO_ON_THE_PRM)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert stage_statuses(ws) == {"data_prep": "cached", "sft": "cached", "prm": "cached", "rl": "ran"}
    client = mlflow_client(ws)
    (run,) = [r for r in stage_runs(ws, "rl") if r.data.params.get("reward.source") == "prm"
              and r.data.tags.get(run_tags.TAG_STATUS) == run_tags.COMPLETE]
    assert made(ws, first_run, "prm").info.run_id in run.data.tags[run_tags.TAG_INPUT_PREFIX + "prm"]
    reward = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/reward"), key=lambda m: m.step)]
    kl = [m.value for m in client.get_metric_history(run.info.run_id, "train/kl")]
    first, last = sum(reward[:3]) / 3, sum(reward[-3:]) / 3
    print(f"PPO with the PRM: mean reward, first 3 steps {first:.3f}, last 3 steps {last:.3f}; max KL {max(kl):.4f}")
    assert len(reward) == 9 and last > first
    assert max(kl) < 0.2


def test_iterative_dpo_samples_better_answers_round_by_round(ws, first_run, in_process):
    """`--only dpo` with three rounds of 25 steps: each round samples 4 answers to 128 prompts from the current
    policy, ranks them by the rule reward and trains on best-vs-worst pairs. The share of correct answers in the
    policy's own samples rises round by round (a 6-round run read 0.58, 0.69, 0.76, 0.78, 0.84, 0.86:
    docs/benchmarks.md); 512 answers a round put the standard error of a difference near 0.03."""
    result = in_process("run", "--only", "dpo", "dpo.iterative.rounds=3", "dpo.max_steps=75",
                        "dpo.iterative.prompts_per_round=128")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert stage_statuses(ws) == {"data_prep": "cached", "sft": "cached", "dpo": "ran"}
    assert "[dpo] round 3/3: 128 prompts x 4 samples" in result.stdout
    (online,) = [r for r in stage_runs(ws, "dpo") if r.data.params["dpo.iterative.rounds"] == "3"
                 and r.data.tags.get(run_tags.TAG_STATUS) == run_tags.COMPLETE]
    rounds = sorted(mlflow_client(ws).get_metric_history(online.info.run_id, "round/reward_mean"), key=lambda m: m.step)
    print("iterative DPO, the policy's own samples' reward by round: " + ", ".join(f"{m.value:.3f}" for m in rounds))
    assert [m.step for m in rounds] == [0, 25, 50]
    assert rounds[-1].value >= rounds[0].value + 0.08
    assert len(versions_of(ws, "rlhf-dpo", online)) == 1


def test_mlflow_holds_runs_params_curves_and_a_loadable_checkpoint(ws, first_run, tmp_path, monkeypatch):
    client = mlflow_client(ws)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)  # the registry follows it
    exp = client.get_experiment_by_name("rlhf-pipeline")
    parents = client.search_runs([exp.experiment_id], "tags.`rlhf.kind` = 'pipeline'")
    sft_run = made(ws, first_run, "sft")
    assert sft_run.data.tags[run_tags.TAG_PARENT] in {p.info.run_id for p in parents}
    assert float(sft_run.data.params["sft.lr"]) == 2e-3
    assert sft_run.data.tags[run_tags.TAG_INPUT_PREFIX + "base_model"].startswith("runs:/")
    curve = client.get_metric_history(sft_run.info.run_id, "train/loss")
    assert len(curve) >= 10 and curve[-1].value < curve[0].value
    assert [a.path for a in client.list_artifacts(sft_run.info.run_id)] == ["sft_model"]
    # the stage function's own span (in a Ray worker for SFT, the driver for RL) lies inside its run (the
    # rest is orchestration) and is logged as a metric
    rl_run = made(ws, first_run, "rl")
    for run in (sft_run, rl_run):
        start, end = map(float, run.data.tags[run_tags.TAG_COMPUTE_SPAN].split())
        assert run.info.start_time / 1000 < start < end < run.info.end_time / 1000
        assert run.data.metrics[store.METRIC_COMPUTE_S] == pytest.approx(end - start, abs=1e-3)

    (version,) = client.search_model_versions("name = 'rlhf-sft'")
    assert version.run_id == sft_run.info.run_id
    assert version.tags["rlhf.eval.verdict"] == "no contest: the only version scored on reward"  # one version: no champion
    eval_run = made(ws, first_run, "eval")
    assert {a.path for a in client.list_artifacts(eval_run.info.run_id, "plots")} == {"plots/eval_by_model.png"}
    assert {a.path for a in client.list_artifacts(rl_run.info.run_id, "plots")} == {"plots/rl_curves.png"}
    first = client.get_run(first_run["cold_parent"])
    assert_the_ui_views(client, exp.experiment_id, first, sft_run, eval_run, version)
    summary = client.download_artifacts(first.info.run_id, "summary.md", str(tmp_path))
    assert re.search(r"^\| sft \| ran \| .* \| data_prep \|$", Path(summary).read_text(), re.M)  # lineage: sft read data_prep's outputs
    path = mlflow.artifacts.download_artifacts(artifact_uri="models:/rlhf-sft/latest", dst_path=str(tmp_path))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Compute 12+7"}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "Answer:" in tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def assert_the_ui_views(client, experiment_id, parent, sft_run, eval_run, version):
    """What the MLflow UI's views read (the runs list, a run's page, compare, Models, the registry)."""
    # the pipeline run: named by config and outcome, its summary table with links as its description, and
    # each stage's headline metrics, equal to the stage runs' own
    assert parent.info.run_name == "tiny · 6 ran, 1 cached"  # data_prep finished before the kill
    note = parent.data.tags["mlflow.note.content"]
    assert f"[{sft_run.info.run_id[:8]}](#/experiments/{experiment_id}/runs/{sft_run.info.run_id})" in note
    assert parent.data.metrics["sft/eval/loss"] == sft_run.data.metrics["eval/loss"]
    assert parent.data.metrics["eval/rl/sampled_accuracy"] == eval_run.data.metrics["rl/sampled_accuracy"]
    # a stage run: named by stage and settings, the datasets it read as inputs, its checkpoint a logged model
    assert sft_run.info.run_name == "sft · tiny"
    assert f"(#/experiments/{experiment_id}/runs/{parent.info.run_id})" in sft_run.data.tags["mlflow.note.content"]
    read = {(i.dataset.name, next(t.value for t in i.tags if t.key == "mlflow.data.context")): i.dataset for i in sft_run.inputs.dataset_inputs}
    assert set(read) == {("sft_data", "train"), ("sft_data", "eval")} and json.loads(read["sft_data", "train"].profile) == {"num_rows": 4000}
    assert any(k.startswith("system/") for k in sft_run.data.metrics)
    (model,) = client.search_logged_models([experiment_id], filter_string=f"source_run_id = '{sft_run.info.run_id}'")
    assert model.name == "sft_model" and {m.key for m in model.metrics} >= {"eval/loss", "eval/accuracy", "eval/sampled_accuracy"}
    # the registered version: where it came from
    assert version.tags["rlhf.pipeline_run"] == parent.info.run_id and version.tags["rlhf.fingerprint"] == sft_run.data.tags[run_tags.TAG_FINGERPRINT]
    assert version.tags["rlhf.data.sft_data/train"] == read["sft_data", "train"].digest
    assert version.tags["rlhf.parent.base_model"].startswith("runs:/") and "SFT policy" in version.description
    # eval: a child run per model with the same keys, so the models chart side by side
    children = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{eval_run.info.run_id}'")
    assert sorted(r.info.run_name for r in children) == ["eval · base", "eval · dpo", "eval · rl", "eval · sft"]
    assert len({frozenset(r.data.metrics) for r in children}) == 1


def test_identical_rerun_is_all_cached_and_trains_nothing(ws, first_run):
    result = first_run["cached"]
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = dict(first_run["cached_statuses"])
    assert statuses.pop("lora_merge") == "skipped" and set(statuses.values()) == {"cached"}
    assert "[sft] step" not in result.stdout and "[ray] connected" not in result.stdout
    assert first_run["sft_runs_after_cached"] == first_run["sft_runs_before_cached"]
    # in the MLflow UI: named so, with a child run per stage it reused and the same headline metrics
    client = mlflow_client(ws)
    exp = client.get_experiment_by_name("rlhf-pipeline")
    newest = client.get_run(first_run["cached_parent"])
    assert newest.info.run_name == "tiny · all cached"
    reused = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{newest.info.run_id}'")
    assert sorted(r.info.run_name for r in reused) == sorted(f"{s} · cached" for s in statuses)
    cold = client.get_run(first_run["cold_parent"])  # the run that made them
    assert newest.data.metrics == cold.data.metrics


def test_reward_models_are_accurate_and_registered(ws, first_run):
    runs = {}
    for name, stage in (("rlhf-reward", "rm"), ("rlhf-prm", "prm")):
        runs[stage] = made(ws, first_run, stage)
        assert len(versions_of(ws, name, runs[stage])) == 1
    rm, prm = runs["rm"].data.metrics, runs["prm"].data.metrics
    assert "eval/accuracy" in rm and "eval/margin" in rm and "eval/step_accuracy" in prm
    print(f"rm eval pairwise accuracy {rm['eval/accuracy']:.3f}, prm eval step accuracy {prm['eval/step_accuracy']:.3f}")
    assert rm["eval/accuracy"] >= 0.9 and prm["eval/step_accuracy"] >= 0.9


def test_force_reruns_the_stage_and_its_consumers_follow(ws, first_run, in_process):
    """Nothing changed, but `--force dpo` reruns DPO; eval consumes its new checkpoint, so its fingerprint
    changes and it reruns too, scoring only the new DPO checkpoint (the other models' scores are the first
    eval's, per model: flows/eval_reuse.py); everything else stays cached."""
    first_eval = made(ws, first_run, "eval")
    versions = len(mlflow_client(ws).search_model_versions("name = 'rlhf-dpo'"))
    evals_before = {r.info.run_id for r in stage_runs(ws, "eval")}
    result = in_process("run", "--force", "dpo")
    assert result.returncode == 0, result.stderr[-3000:]
    assert stage_statuses(ws) == {"data_prep": "cached", "sft": "cached", "rm": "cached", "prm": "cached", "rl": "cached",
                                  "dpo": "ran", "lora_merge": "skipped", "eval": "ran"}
    assert len(mlflow_client(ws).search_model_versions("name = 'rlhf-dpo'")) == versions + 1  # the forced one
    for model in ("base", "sft", "rl"):
        assert f"[eval] {model}: scores of MLflow run {first_eval.info.run_id} reused" in result.stdout
    assert "[eval] dpo: scores of" not in result.stdout
    (second_eval,) = [r for r in stage_runs(ws, "eval") if r.data.tags.get(run_tags.TAG_STATUS) == run_tags.COMPLETE
                      and r.info.run_id not in evals_before]
    assert second_eval.data.tags["rlhf.eval.reused.sft"] == first_eval.info.run_id
    for key in ("sft/accuracy", "sft/sampled_accuracy", "rl/sampled_accuracy"):
        assert second_eval.data.metrics[key] == first_eval.data.metrics[key]


def test_runs_lists_pipeline_runs_and_compare_puts_them_side_by_side(ws, first_run, cli):
    # `rlhf runs` and `rlhf compare` in this process (`cli`): they only read the store, and each CLI subprocess
    # paid seconds of interpreter start and MLflow imports for it
    client = mlflow_client(ws)
    exp = client.get_experiment_by_name("rlhf-pipeline")
    parents = client.search_runs([exp.experiment_id], "tags.`rlhf.kind` = 'pipeline'", order_by=["attributes.start_time DESC"])
    listed = cli("runs", "--limit", "50")
    assert listed.returncode == 0, listed.stderr
    assert all(p.info.run_id in listed.stdout for p in parents)
    cold, cached = first_run["cold_parent"], first_run["cached_parent"]
    compared = cli("compare", cold, cached)
    assert compared.returncode == 0, compared.stderr
    assert "sft: eval/loss" in compared.stdout and "eval sft/accuracy" in compared.stdout
    # the terminal and the UI's compare view show the same numbers: the pipeline runs' headline metrics
    assert f"{client.get_run(cached).data.metrics['sft/eval/loss']:.4g} (cached)" in compared.stdout
    assert "(cached)" in compared.stdout and "(ran)" in compared.stdout
    missing = cli("compare", "not-a-run")
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: run not-a-run: no such MLflow run in {client.tracking_uri}"


def test_a_pinned_input_runs_one_stage_on_the_cluster_named_in_the_config(ws, first_run, ray_head, in_process):
    """`--only eval inputs.rl_model=runs:/<dpo run>/dpo_model infra.ray_address=...`: eval runs on the offline
    DPO checkpoint in the RL slot, on the `ray start` cluster; the rl stage does not run at all, and the
    eval run records that lineage."""
    port, head = ray_head
    dpo = max((r for r in stage_runs(ws, "dpo") if r.data.tags.get(run_tags.TAG_STATUS) == run_tags.COMPLETE
               and r.data.params["dpo.iterative.rounds"] == "0"), key=lambda r: r.info.start_time)
    pin = f"runs:/{dpo.info.run_id}/dpo_model"
    # a quarter of the held-out prompts, one sample each: the same two checkpoints score the same either way
    result = run_cli(ws, "run", "--only", "eval", f"inputs.rl_model={pin}", f"infra.ray_address=127.0.0.1:{port}",
                     "eval.max_samples=50", "eval.samples_per_prompt=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"[ray] connected to cluster at 127.0.0.1:{port}" in result.stdout
    assert "Started a local Ray instance" not in result.stdout + result.stderr
    assert head.poll() is None  # the pipeline disconnects; it does not stop a cluster it did not start
    assert stage_statuses(ws) == {"data_prep": "cached", "sft": "cached", "dpo": "cached", "eval": "ran"}
    (pinned,) = [r for r in stage_runs(ws, "eval") if r.data.tags.get(run_tags.TAG_INPUT_PREFIX + "rl_model") == pin]
    m = pinned.data.metrics
    assert m["rl/accuracy"] == m["dpo/accuracy"] and m["rl/sampled_accuracy"] == m["dpo/sampled_accuracy"]
    unknown = in_process("run", "--only", "eval", f"inputs.rl_model=runs:/{dpo.info.run_id}/nothing")
    assert unknown.returncode == 2 and f"inputs.rl_model=runs:/{dpo.info.run_id}/nothing: run" in unknown.stderr


@dataclass
class Served:
    """`rlhf serve` running from the module's folder, with the Prefect server and MLflow UI it started."""

    api: str
    mlflow_port: int
    env: dict[str, str]
    log: Path
    folder: Path

    def deployment_run(self, name: str, *params: str) -> subprocess.CompletedProcess:
        args = [a for p in params for a in ("-p", p)]
        return subprocess.run([PREFECT, "deployment", "run", f"rlhf-pipeline/{name}", "--watch", *args], cwd=self.folder,
                              env=self.env | {"PREFECT_API_URL": self.api}, capture_output=True, text=True, timeout=600)

    @contextmanager
    def client(self):
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings({PREFECT_API_URL: self.api}), get_client(sync_client=True) as client:
            yield client


@pytest.fixture(scope="module")
def served(ws, tmp_path_factory):
    """`rlhf serve` started once for the tests of the served deployments: a Prefect server and the MLflow UI
    of its own, rlhf-pipeline/full and /stage served; stopping it stops both servers."""
    from flows.cli.serve import answers
    from stages.common.dist_env import free_port

    prefect_port, mlflow_port = free_port(), free_port()
    env = cli_env(ws) | {"PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    env.pop("PREFECT_API_URL", None)  # not the module's shared server: `rlhf serve` starts (and stops) its own
    folder = tmp_path_factory.mktemp("serve")
    log = folder / "serve.log"
    with open(log, "w") as out:
        serve = subprocess.Popen([*CLI, "serve", "--prefect-port", str(prefect_port), "--mlflow-port", str(mlflow_port)],
                                 cwd=ws, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{prefect_port}/api"
    try:
        deadline = time.monotonic() + 240
        while "prefect deployment run" not in log.read_text() and time.monotonic() < deadline:
            assert serve.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert answers(f"{api}/health") and answers(f"http://127.0.0.1:{mlflow_port}/health"), log.read_text()[-3000:]
        yield Served(api, mlflow_port, env, log, folder)
    finally:
        serve.send_signal(signal.SIGTERM)  # the serve process itself: it must stop what it started
        serve.wait(timeout=90)
    assert not answers(f"{api}/health") and not answers(f"http://127.0.0.1:{mlflow_port}/health")


def store_contents(ws) -> tuple[int, int]:
    """(runs, registered model versions) in the module's MLflow store, every experiment."""
    client = mlflow_client(ws)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(experiments)) if experiments else 0, len(client.search_model_versions())


REFUSED = {
    "a reward file": ('overrides=["reward.func_path=missing.py"]',
                      "override 'reward.func_path=missing.py': reward.func_path names the Python file the reward workers "
                      "run; a deployment run takes data and hyperparameter overrides only: set reward.func_path in the "
                      f"config file on the worker ({Path(configs.__file__).parent / 'tiny.yaml'})"),
    "another config file": ("config=/tmp/any.yaml",
                            "config='/tmp/any.yaml': a deployment run takes the config file its deployment was registered "
                            "with ('tiny'); to run another, serve a deployment for it (rlhf serve --config FILE)"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_served_run_that_would_choose_code_is_refused_at_once_and_runs_nothing(ws, served, case):
    """Whoever reaches the Prefect server can start a deployment run with any parameters: one that names a
    reward file (code the reward workers would run), or a config file of its choosing on the worker (which may
    set any key), ends it Failed within seconds, its state message and logs holding the one line `rlhf run`
    prints, with no stage task submitted and nothing written to MLflow."""
    parameter, expected = REFUSED[case]
    before = store_contents(ws)
    started = time.monotonic()
    result = served.deployment_run("full", parameter)
    took = time.monotonic() - started
    print(f"prefect deployment run to Failed: {took:.1f} s")
    assert result.returncode == 1 and "Flow run finished in state 'Failed'." in result.stdout, \
        result.stdout[-3000:] + served.log.read_text()[-3000:]
    assert took < 60, f"{took:.0f} s to Failed: the refusal comes before any stage task"
    flow_run_id = UUID(re.search(r"UUID: (\S+)", result.stdout).group(1))
    with served.client() as client:
        flow_run = client.read_flow_run(flow_run_id)
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    assert flow_run.state.is_failed() and flow_run.state.message == expected
    assert f"Finished in state Failed({expected!r})" in [log.message for log in logs]
    assert tasks == []
    assert store_contents(ws) == before


def test_served_deployments_run_the_pipeline_and_one_stage(ws, first_run, served):
    """`rlhf serve` starts a Prefect server and the MLflow UI and serves rlhf-pipeline/full and /stage;
    `prefect deployment run` drives the stage one; stopping the serve stops both servers (`served`)."""
    # the stage deployment: rm with a changed setting, on what the first run made (the full deployment runs
    # through a work pool in tests/flow/test_cluster.py)
    one = served.deployment_run("stage", 'only=["rm"]', 'overrides=["rm.max_steps=15"]')
    assert one.returncode == 0 and "Completed" in one.stdout, one.stdout[-3000:] + served.log.read_text()[-3000:]
    assert stage_statuses(ws) == {"data_prep": "cached", "sft": "cached", "rm": "ran"}
    (rm,) = [r for r in stage_runs(ws, "rm") if r.data.params.get("rm.max_steps") == "15"]
    assert rm.data.tags.get(run_tags.TAG_STATUS) == run_tags.COMPLETE


# --- faults ----------------------------------------------------------------------------------


def test_a_stage_that_raises_fails_the_flow_with_its_error_and_registers_nothing(ws, first_run, tmp_path):
    """A reward function that raises: RL fails with one line naming the file and the error; the stages
    before it stay cached, the stages after it (eval, lora_merge) do not start, no RL model is registered."""
    boom = tmp_path / "boom.py"
    boom.write_text("def reward_func(queries, prompts, labels):\n    raise ValueError('no reward today')\n")
    versions = len(mlflow_client(ws).search_model_versions("name = 'rlhf-rl'"))
    # no KL term: no reference actor to start for a run that fails at its first scoring, which is RL's eval of
    # the SFT policy before its first step: 16 held-out prompts, not the preset's 200 (eval.* keys are RL's and
    # eval's alone, so every stage before RL stays cached)
    result = run_cli(ws, "run", f"reward.func_path={boom}", "rl.max_steps=2", "rl.algorithm.init_kl_coef=0",
                     "eval.max_samples=16", "eval.samples_per_prompt=0")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"error: reward_func in {boom} raised ValueError: no reward today"
    assert "Traceback" not in result.stdout + result.stderr  # it is in the stage's MLflow run, tag rlhf.error
    statuses = stage_statuses(ws)
    assert statuses.pop("rl") == "failed"
    assert statuses == dict.fromkeys(("data_prep", "sft", "rm", "prm", "dpo"), "cached")  # eval, lora_merge: never started
    assert len(mlflow_client(ws).search_model_versions("name = 'rlhf-rl'")) == versions
    (failed,) = [r for r in stage_runs(ws, "rl") if str(boom) in r.data.params.get("reward.func_path", "")]
    assert failed.data.tags[run_tags.TAG_STATUS] == "failed" and failed.info.status == "FAILED"


def test_two_pipeline_runs_at_once_on_one_store(ws, first_run):
    """Both finish; the stage they both need runs once (the second waits for it and reuses it), and
    its registered checkpoint is whole."""
    args = ["run", "--only", "rm", "rm.max_steps=25"]
    procs = [subprocess.Popen([*CLI, *args], cwd=ws, env=cli_env(ws), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert sorted("[rm] cached" in out for out in outs) == [False, True]
    (run,) = [r for r in stage_runs(ws, "rm") if r.data.params.get("rm.max_steps") == "25"]
    assert run.data.tags[run_tags.TAG_STATUS] == run_tags.COMPLETE
    (_version,) = mlflow_client(ws).search_model_versions(f"name = 'rlhf-reward' and run_id = '{run.info.run_id}'")
    path = Path(mlflow_client(ws).download_artifacts(run.info.run_id, "reward_model", str(ws / "check")))
    from stages.rewards.rm_scorer import load_reward_model

    load_reward_model(path)


# (signal, exit status, the last line's first word, whether the run starts Prefect's temporary server, RL
# steps: each stop its own RL fingerprint and work dir): a Ctrl-C in the terminal, and the SIGTERM that
# `timeout`, systemd's stop and SLURM's cancel send to the whole process group, where the run's own
# temporary server must outlive it to record the stop
STOPS = {"ctrl-c": (signal.SIGINT, 130, "interrupted", False, 4),
         "sigterm-to-the-group": (signal.SIGTERM, 143, "terminated", True, 5)}


@pytest.mark.parametrize("stop", STOPS)
def test_a_stop_during_rl_ends_it_within_seconds_registers_nothing_and_keeps_its_checkpoints(ws, first_run, tmp_path, stop):
    """A Ctrl-C (SIGINT to the whole process group) or a SIGTERM to the group mid-RL: RL runs in the flow
    process's task thread, where no signal lands; the flow stops it and its actors, marks its MLflow run
    KILLED, registers nothing, and the process ends with 130 (143) and one line saying how to go on. Its
    checkpoints stay in the work dir of its fingerprint, where a rerun resumes (as SFT's above; RL's
    resume itself: tests/stage/test_rl_algorithms.py)."""
    sig, status, word, own_server, steps = STOPS[stop]
    args = ["--only", "rl", f"rl.max_steps={steps}", "rl.save_every=1", "rl.eval_every=4", "rl.rollout.batch_size=8",
            "rl.rollout.n_samples_per_prompt=4", "rl.train_batch_size=32", "eval.max_samples=16", "eval.samples_per_prompt=0"]
    versions = len(mlflow_client(ws).search_model_versions("name = 'rlhf-rl'"))
    before = set((ws / ".rlhf" / "work").glob("rl-*"))
    env = cli_env(ws)
    if own_server:
        env.pop("PREFECT_API_URL")
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen([*CLI, "run", *args], cwd=ws, env=env, stdout=stdout, stderr=stderr,
                                start_new_session=True)
    deadline = time.monotonic() + 300
    saved = []
    while time.monotonic() < deadline and not saved:
        assert proc.poll() is None, out.read_text()[-3000:] + err.read_text()[-3000:]
        saved = [d for d in (ws / ".rlhf" / "work").glob("rl-*") if d not in before and (d / "checkpoints" / "policy" / "latest").exists()]
        time.sleep(0.2)
    assert saved, "RL never wrote a checkpoint"
    cluster = cluster_processes(proc.pid)  # with its own server: that too
    interrupted = time.monotonic()
    os.killpg(proc.pid, sig)
    proc.wait(timeout=120)
    took = time.monotonic() - interrupted
    output = out.read_text() + err.read_text()
    assert proc.returncode == status, output[-3000:]
    assert err.read_text().splitlines()[-1] == f"{word}: stopped during stage rl; rerun to resume"
    assert "Traceback" not in output and "[rl] interrupted" in output
    assert took < 30, f"{took:.1f} s from the signal to exit"
    (run,) = [r for r in stage_runs(ws, "rl") if r.data.params.get("rl.max_steps") == str(steps)]
    assert run.info.status == "KILLED" and run.data.tags[run_tags.TAG_STATUS] == "interrupted"
    assert len(mlflow_client(ws).search_model_versions("name = 'rlhf-rl'")) == versions
    assert (saved[0] / "checkpoints" / "policy" / "latest").exists()
    assert_gone(cluster, within_s=30)
