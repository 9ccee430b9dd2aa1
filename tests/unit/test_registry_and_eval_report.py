"""The registry's `champion` alias, the eval run's child runs and plots, and the summary's lineage column and
held-out table."""

import json
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from artifacts import model_registry as registry
from artifacts import run_tags, store
from artifacts.store import ArtifactRef
from flows import eval_report
from flows.stage_task import StageOutcome
from flows.summary import lineage, markdown, model_table, summary_rows
from tests.unit.conftest import stage_run


def champion(client, name):
    return str(client.get_model_version_by_alias(name, registry.CHAMPION).version)


def test_champion_goes_only_to_a_version_that_beats_the_others(client, tmp_path):
    first, second, third = (stage_run(client, tmp_path, register=True) for _ in range(3))
    eval_run = client.create_run(client.exp).info.run_id

    def promote(run_id, score):
        return registry.promote_champions(client, [("sft_model", run_id, score)], "accuracy", eval_run)

    assert promote(first, 0.80) == {"rlhf-sft": ("1", "no contest: the only version scored on accuracy")}
    with pytest.raises(MlflowException):  # one version alone is not crowned
        champion(client, "rlhf-sft")
    assert promote(second, 0.75) == {"rlhf-sft": ("2", "behind version(s) 1 on accuracy (0.75 < 0.8)")}
    assert champion(client, "rlhf-sft") == "1"  # now it beats another
    assert promote(third, 0.80) == {"rlhf-sft": ("3", "tied on accuracy with version(s) 1")}
    assert champion(client, "rlhf-sft") == "1"  # a tie keeps it
    assert promote(second, 0.90) == {"rlhf-sft": ("2", "champion: beats version(s) 1, 3 on accuracy")}
    assert champion(client, "rlhf-sft") == "2"
    version = client.get_model_version("rlhf-sft", "2")
    assert version.tags == {"rlhf.eval.accuracy": "0.9", "rlhf.eval.run": eval_run,
                            "rlhf.eval.verdict": "champion: beats version(s) 1, 3 on accuracy"}
    # an output that was never registered (the base model) is scored by nobody
    assert registry.promote_champions(client, [("base_model", first, 1.0)], "accuracy", eval_run) == {}


@pytest.mark.parametrize(("scores", "current", "expected"), [
    ({}, None, None),
    ({"1": 0.5}, None, None),
    ({"1": 0.5, "2": 0.7}, "1", "2"),
    ({"1": 0.7, "2": 0.7}, None, None),  # a tie with no champion crowns nobody
    ({"1": 0.7, "2": 0.7, "3": 0.1}, "2", "2"),
    ({"1": -0.2, "2": -0.1}, None, "2"),  # an RM's rewards can be negative
])
def test_contest(scores, current, expected):
    champion, verdicts = registry.contest(scores, current, "reward")
    assert champion == expected and set(verdicts) == set(scores)


def test_latest_is_the_newest_version(client, tmp_path):
    stage_run(client, tmp_path, register=True)
    newest = stage_run(client, tmp_path, register=True)
    for name in ("rlhf-sft/latest", "rlhf-sft@latest"):
        assert registry.model_version(client, name).run_id == newest


def test_eval_report_adds_a_child_run_per_model_with_the_same_keys_and_the_plot(client, tmp_path):
    sft = stage_run(client, tmp_path, register=True)
    rl = stage_run(client, tmp_path, register=True, artifact="rl_model")
    eval_run = client.create_run(client.exp, run_name="eval · tiny").info.run_id
    client.log_text(eval_run, '{"prompt": "p1", "response": "r1", "reward": 1.0}\n', "eval_report/samples_sft.jsonl")
    inputs = {"base_model": f"runs:/{sft}/base_model", "sft_model": f"runs:/{sft}/sft_model",
              "rl_model": f"runs:/{rl}/rl_model", "eval_data": f"runs:/{sft}/eval_data"}
    metrics = {"score": 0.9, "base/reward": 0.1, "sft/reward": 0.8, "sft/sampled_reward": 0.6,
               "rl/reward": 0.9, "rl/sampled_reward": 0.85, "time/compute_s": 3.0}
    verdicts = eval_report.publish(client, eval_run, inputs, metrics, "reward")
    assert verdicts == {"rlhf-sft": ("1", "no contest: the only version scored on reward"),
                        "rlhf-rl": ("1", "no contest: the only version scored on reward")}
    assert {a.path for a in client.list_artifacts(eval_run, "plots")} == {"plots/eval_by_model.png"}
    children = {r.data.tags["rlhf.model"]: r for r in client.search_runs([client.exp], f"tags.`mlflow.parentRunId` = '{eval_run}'")}
    assert {m: r.info.run_name for m, r in children.items()} == {"base": "eval · base", "sft": "eval · sft", "rl": "eval · rl"}
    assert children["rl"].data.metrics == {"eval/reward": 0.9, "eval/sampled_reward": 0.85}
    assert children["base"].data.metrics == {"eval/reward": 0.1}
    assert all(run_tags.TAG_STAGE not in r.data.tags for r in children.values())  # no cache entries
    table = client.download_artifacts(children["sft"].info.run_id, eval_report.SAMPLES_TABLE, str(tmp_path))
    assert json.loads(Path(table).read_text())["data"] == [["p1", "r1", 1.0]]


def test_the_rl_run_gets_its_headline_curves(client, tmp_path):
    rl = stage_run(client, tmp_path, register=True, artifact="rl_model")
    client.log_batch(rl, metrics=[Metric("train/reward", r, 0, step) for step, r in enumerate((0.2, 0.5, 0.7))]
                     + [Metric("train/kl", k, 0, step) for step, k in enumerate((0.0, 0.01, 0.02))])
    eval_report.log_rl_curves(client, rl)
    png = Path(client.download_artifacts(rl, eval_report.RL_PLOT, str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = eval_report.curves_figure({"train/reward": [(1, 0.2), (2, 0.5)]})
    assert fig._suptitle.get_text() == "RL training curves" and fig.axes[0].get_title() == "train/reward"


def test_a_resumed_rl_runs_curves_are_the_uninterrupted_runs(client, tmp_path):
    """A run resumed from step 2's checkpoint logged steps 3-5; the attempt a kill ended logged 1-3. Its plot draws
    steps 1-2 from that attempt and 3-5 from itself (its own step 3 over the attempt's): the uninterrupted run's
    curve, and so the same PNG bytes. A run of other work (another fingerprint) lends it nothing."""
    def run(fingerprint: str, points: dict[int, float], resumed: bool = False) -> str:
        run_id = client.create_run(client.exp, tags={run_tags.TAG_STAGE: "rl", run_tags.TAG_FINGERPRINT: fingerprint}).info.run_id
        client.log_batch(run_id, metrics=[Metric("train/reward", v, 0, step) for step, v in points.items()]
                         + ([Metric(store.METRIC_RESUMED, 2.0, 0, 0)] if resumed else []))
        return run_id

    run("other", {1: 9.0, 2: 9.0})
    run("work", {1: 0.1, 2: 0.2, 3: 0.25})  # killed during step 4, after its step-2 checkpoint
    resumed = run("work", {3: 0.3, 4: 0.4, 5: 0.5}, resumed=True)
    clean = run("clean", {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 5: 0.5})
    assert eval_report.rl_curves(client, resumed) == {"train/reward": [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4), (5, 0.5)]}
    assert eval_report.rl_curves(client, clean) == eval_report.rl_curves(client, resumed)
    plots = []
    for run_id in (resumed, clean):
        eval_report.log_rl_curves(client, run_id)
        plots.append(Path(client.download_artifacts(run_id, eval_report.RL_PLOT, str(tmp_path / run_id))).read_bytes())
    assert plots[0] == plots[1]


def test_the_champion_is_chosen_by_eval_metric(client, tmp_path):
    """Three SFT versions whose greedy reward and regex accuracy disagree: `champion` follows the metric
    asked for, and the reward model a reward source consumed is no candidate."""
    runs = [stage_run(client, tmp_path, register=True) for _ in range(3)]
    rm = stage_run(client, tmp_path, register=True, artifact="reward_model")
    scores = [(0.5, 0.9), (0.4, 0.95), (0.6, 0.1)]  # (reward, accuracy) per version

    def evaluate(i, metric):
        eval_run = client.create_run(client.exp).info.run_id
        inputs = {"sft_model": f"runs:/{runs[i]}/sft_model", "reward_model": f"runs:/{rm}/reward_model"}
        metrics = {"sft/reward": scores[i][0], "sft/accuracy": scores[i][1], "reward/reward": 9.0}
        return eval_report.publish(client, eval_run, inputs, metrics, metric)

    assert evaluate(0, "reward")["rlhf-sft"][1].startswith("no contest")  # the first one scored
    assert evaluate(1, "reward")["rlhf-sft"][1].startswith("behind")  # more accurate, less rewarded
    assert champion(client, "rlhf-sft") == "1"
    assert evaluate(2, "reward")["rlhf-sft"][1].startswith("champion")
    assert champion(client, "rlhf-sft") == "3"
    assert client.get_model_version("rlhf-sft", "2").tags["rlhf.eval.reward"] == "0.4"
    assert "rlhf.eval.reward" not in client.get_model_version("rlhf-reward", "1").tags
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("rlhf-reward", registry.CHAMPION)
    # by accuracy (a version scored by another metric only is no contender)
    assert evaluate(1, "accuracy")["rlhf-sft"][1].startswith("no contest")
    assert champion(client, "rlhf-sft") == "3"
    assert evaluate(0, "accuracy")["rlhf-sft"][1].startswith("behind")
    assert champion(client, "rlhf-sft") == "2"


def test_metrics_figure_has_a_bar_per_model_and_metric_the_ranking_one_first():
    models = {"base": {"reward": 0.1, "pass_at_k": 0.3, "perplexity": 50.0},
              "sft": {"reward": 0.8, "sampled_reward": 0.6, "pass_at_k": 0.9, "accuracy": 0.7, "perplexity": 1.1}}
    fig = eval_report.metrics_figure(models, "pass_at_k")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["pass at k", "reward", "sampled reward", "accuracy"]
    heights = sorted(round(p.get_height(), 3) for p in ax.patches)
    assert heights == [0.0, 0.0, 0.1, 0.3, 0.6, 0.7, 0.8, 0.9]  # a zero bar where a model lacks one: groups stay aligned
    assert [t.get_text() for t in ax.get_xticklabels()] == ["base", "sft"]


def test_the_held_out_table_has_a_row_per_evaluated_model_only():
    """A cached eval's metrics are its run's: the flow's `time/compute_s` is there too, and is no model."""
    metrics = {"accuracy": 0.9, "base/accuracy": 0.1, "sft/accuracy": 0.8, "sft/sampled_accuracy": 0.6,
               store.METRIC_COMPUTE_S: 12.5, "sft_accuracy": 0.8}
    inputs = {"base_model": "runs:/d1/base_model", "sft_model": "runs:/s1/sft_model", "eval_data": "runs:/d1/eval_data"}
    table = model_table(StageOutcome("eval", "cached", 0.1, "e1", metrics=metrics, inputs=inputs))
    assert [c.header for c in table.columns] == ["model", "accuracy", "sampled_accuracy"]
    assert [list(c.cells) for c in table.columns] == [["base", "sft"], ["0.1", "0.8"], ["-", "0.6"]]
    assert model_table(StageOutcome("eval", "cached", 0.1, "e1", metrics={store.METRIC_COMPUTE_S: 1.0}, inputs=inputs)) is None


def test_the_summarys_held_out_table_leads_with_eval_metric():
    table = model_table(StageOutcome("eval", "ran", 0.1, "e1", inputs={"sft_model": "runs:/s1/sft_model"},
                                     metrics={"score": 0.8, "sft/accuracy": 0.9, "sft/reward": 0.8, "sft/pass_at_k": 1.0}), "reward")
    assert [c.header for c in table.columns] == ["model", "reward", "accuracy", "pass_at_k"]
    assert table.title == "held-out eval (champion by reward)"
    assert [c.header for c in model_table(StageOutcome("eval", "ran", 0.1, "e1", metrics={"sft/accuracy": 0.9},
                                                    inputs={"sft_model": "runs:/s1/sft_model"})).columns] == ["model", "accuracy"]


@pytest.mark.parametrize("pinned", [False, True])
def test_lineage_names_this_runs_stages_and_spells_out_pins(pinned):
    data = StageOutcome("data_prep", "cached", 0.1, "d1", outputs={"sft_data": ArtifactRef("sft_data", "d1")})
    sft = StageOutcome("sft", "ran", 2.0, "s1", inputs={"base_model": "runs:/d1/base_model", "sft_data": "runs:/d1/sft_data"})
    rl_identity = "runs:/x9/dpo_model" if pinned else "runs:/r1/rl_model"
    ev = StageOutcome("eval", "ran", 1.0, "e1", inputs={"sft_model": "runs:/s1/sft_model", "rl_model": rl_identity,
                                                        "eval_data": "runs:/d1/eval_data"})
    outcomes = {"data_prep": data, "sft": sft, "eval": ev}
    if not pinned:
        outcomes["rl"] = StageOutcome("rl", "ran", 3.0, "r1")
    rows = {r["stage"]: r for r in summary_rows(outcomes)}
    assert rows["sft"]["inputs"] == "data_prep"
    assert rows["eval"]["inputs"] == ("sft, rl_model=runs:/x9/dpo_model, data_prep" if pinned else "sft, rl, data_prep")
    assert rows["rm"]["inputs"] == "-" and rows["rm"]["status"] == "not run"
    assert "| eval | ran | 1.0s | - | e1 | " in markdown(list(rows.values()))
    assert lineage({}, {}) == "-"
