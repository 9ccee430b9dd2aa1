"""The registry's `champion` alias, the eval run's plots, and the summary's lineage column and held-out table."""

from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from artifacts import registry
from artifacts import store
from artifacts.store import ArtifactRef
from flows import eval_report
from flows.stage_task import StageOutcome
from flows.summary import lineage, markdown, model_table, summary_rows
from tests.unit.conftest import stage_run


def champion(client, name):
    return str(client.get_model_version_by_alias(name, registry.CHAMPION).version)


def test_champion_moves_only_to_a_version_that_beats_it(client, tmp_path):
    first, second, third = (stage_run(client, tmp_path, register=True) for _ in range(3))
    eval_run = client.create_run(client.exp).info.run_id
    assert registry.promote_champions(client, [("sft_model", first, 0.80)], "accuracy", eval_run) == {"rlhf-sft": "1"}
    assert registry.promote_champions(client, [("sft_model", second, 0.75)], "accuracy", eval_run) == {}
    assert champion(client, "rlhf-sft") == "1"
    assert registry.promote_champions(client, [("sft_model", third, 0.80)], "accuracy", eval_run) == {}  # a tie keeps it
    assert registry.promote_champions(client, [("sft_model", second, 0.90)], "accuracy", eval_run) == {"rlhf-sft": "2"}
    assert champion(client, "rlhf-sft") == "2"
    version = client.get_model_version("rlhf-sft", "2")
    assert version.tags == {"rlhf.eval.accuracy": "0.9", "rlhf.eval.run": eval_run}
    # an output that was never registered (the base model) is scored by nobody
    assert registry.promote_champions(client, [("base_model", first, 1.0)], "accuracy", eval_run) == {}


def test_latest_is_the_newest_version(client, tmp_path):
    stage_run(client, tmp_path, register=True)
    newest = stage_run(client, tmp_path, register=True)
    for name in ("rlhf-sft/latest", "rlhf-sft@latest"):
        assert registry.model_version(client, name).run_id == newest


def test_eval_report_moves_champions_and_logs_the_plots(client, tmp_path):
    sft = stage_run(client, tmp_path, register=True)
    rl = stage_run(client, tmp_path, register=True, artifact="rl_model")
    client.log_batch(rl, metrics=[Metric("reward", r, 0, step) for step, r in enumerate((0.2, 0.5, 0.7))]
                     + [Metric("kl", k, 0, step) for step, k in enumerate((0.0, 0.01, 0.02))])
    eval_run = client.create_run(client.exp).info.run_id
    inputs = {"base_model": f"runs:/{sft}/base_model", "sft_model": f"runs:/{sft}/sft_model",
              "rl_model": f"runs:/{rl}/rl_model", "eval_data": f"runs:/{sft}/eval_data"}
    metrics = {"score": 0.9, "base/reward": 0.1, "sft/reward": 0.8, "sft/sampled_reward": 0.6,
               "rl/reward": 0.9, "rl/sampled_reward": 0.85}
    moved = eval_report.publish(client, eval_run, inputs, metrics, "reward")
    assert moved == {"rlhf-sft": "1", "rlhf-rl": "1"}
    plots = {a.path for a in client.list_artifacts(eval_run, "plots")}
    assert plots == {"plots/eval_by_model.png", "plots/rl_curves.png"}
    png = Path(client.download_artifacts(eval_run, "plots/rl_curves.png", str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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

    assert evaluate(0, "reward") == {"rlhf-sft": "1"}  # the first one scored
    assert evaluate(1, "reward") == {}  # more accurate, less rewarded
    assert evaluate(2, "reward") == {"rlhf-sft": "3"}
    assert client.get_model_version("rlhf-sft", "2").tags["rlhf.eval.reward"] == "0.4"
    assert "rlhf.eval.reward" not in client.get_model_version("rlhf-reward", "1").tags
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("rlhf-reward", registry.CHAMPION)
    # by accuracy (a version scored by another metric has no score to defend: the first scored by it wins)
    assert evaluate(1, "accuracy") == {"rlhf-sft": "2"}
    assert evaluate(0, "accuracy") == {}


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
