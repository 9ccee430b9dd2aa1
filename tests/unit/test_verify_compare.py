"""`rlhf verify`'s comparison of a stage's rerun with its original run: which difference is reported first, and the
one line per stage. Expected values are written out by hand from the histories and digests given."""

from __future__ import annotations

import pytest

from flows.verify.compare import MetricDifference, Verdict, first_file_difference, first_metric_difference, timing, verdict
from flows.verify.targets import split_overrides


def test_identical_files_and_histories_give_no_difference():
    files = {"sft_model/config.json": "a1", "sft_model/model.safetensors": "b2"}
    metrics = {"train/loss": [(1, 2.0), (2, 1.5)], "eval/loss": [(2, 1.7)]}
    result = verdict("sft", files, dict(files), metrics, {k: list(v) for k, v in metrics.items()})
    assert result.identical
    assert result.line() == "sft: identical (2 files, 2 metrics)"


def test_the_first_differing_file_is_the_first_path_in_sorted_order():
    original = {"rl_model/tokenizer.json": "t", "rl_model/model.safetensors": "m", "rl_model/config.json": "c"}
    rerun = {"rl_model/tokenizer.json": "T", "rl_model/model.safetensors": "M", "rl_model/config.json": "c"}
    assert first_file_difference(original, rerun) == "rl_model/model.safetensors"


def test_a_file_only_one_side_has_is_a_difference_and_says_which():
    assert first_file_difference({"a/x": "1", "a/y": "2"}, {"a/x": "1"}) == "a/y (missing in the rerun)"
    assert first_file_difference({"a/y": "2"}, {"a/x": "1", "a/y": "2"}) == "a/x (only in the rerun)"
    assert first_file_difference({}, {}) is None


def test_the_earliest_step_wins_over_the_key_order():
    original = {"a/loss": [(10, 1.0), (20, 2.0)], "z/loss": [(5, 1.0), (10, 3.0)]}
    rerun = {"a/loss": [(10, 1.0), (20, 2.5)], "z/loss": [(5, 1.0), (10, 3.5)]}
    # a/loss parts at step 20, z/loss at step 10: step first, though a < z
    assert first_metric_difference(original, rerun) == MetricDifference("z/loss", 10, 3.0, 3.5)


def test_at_the_same_step_the_first_key_wins():
    original = {"train/loss": [(20, 1.2345)], "eval/loss": [(20, 0.5)]}
    rerun = {"train/loss": [(20, 1.2346)], "eval/loss": [(20, 0.25)]}
    found = first_metric_difference(original, rerun)
    assert found == MetricDifference("eval/loss", 20, 0.5, 0.25)
    assert found.text() == "metric eval/loss at step 20: 0.5 vs 0.25"


def test_a_missing_point_or_metric_counts_from_its_step():
    # the rerun stops after step 2; another metric only the original logged begins at step 3
    original = {"loss": [(1, 1.0), (2, 0.9), (3, 0.8)], "extra": [(3, 7.0)]}
    rerun = {"loss": [(1, 1.0), (2, 0.9)]}
    assert first_metric_difference(original, rerun) == MetricDifference("extra", 3, 7.0, None)
    assert first_metric_difference(rerun, original).text() == "metric extra at step 3: none vs 7.0"


def test_a_point_at_another_step_parts_at_the_earlier_one():
    original = {"eval/loss": [(0, 9.0), (3, 1.0)]}
    rerun = {"eval/loss": [(3, 1.0)]}
    assert first_metric_difference(original, rerun) == MetricDifference("eval/loss", 0, 9.0, None)


def test_values_are_shown_in_full():
    # 0.1 + 0.2 and 0.3 differ in the 17th digit: a rounded display would show the same number twice
    assert MetricDifference("m", 1, 0.1 + 0.2, 0.3).text() == "metric m at step 1: 0.30000000000000004 vs 0.3"


@pytest.mark.parametrize(("key", "timed"), [
    ("time/compute_s", True), ("system/cpu_utilization_percentage", True), ("rl/step_s", True),
    ("rl/samples_per_s", True), ("train/loss", False), ("eval/accuracy", False), ("rows/sft_data/train", False),
])
def test_timing_metrics_are_left_out(key, timed):
    assert timing(key) is timed


def test_a_timing_metric_that_differs_leaves_the_stage_identical():
    original = {"train/loss": [(1, 1.0)], "time/compute_s": [(0, 3.2)], "rl/step_s": [(1, 0.4)]}
    rerun = {"train/loss": [(1, 1.0)], "time/compute_s": [(0, 5.9)], "rl/step_s": [(1, 0.7)]}
    result = verdict("rl", {}, {}, original, rerun)
    assert result.identical and result.metrics == 1


def test_both_kinds_of_difference_are_on_the_one_line():
    result = verdict("rl", {"rl_model/model.safetensors": "a"}, {"rl_model/model.safetensors": "b"},
                     {"train/loss": [(20, 1.5)]}, {"train/loss": [(20, 1.25)]})
    assert result.line() == "rl: differs: first at rl_model/model.safetensors; metric train/loss at step 20: 1.5 vs 1.25"


def test_a_resumed_original_is_compared_from_the_step_it_resumed_at():
    # killed after step 4 and resumed: the original run logged from step 4 on, and resumed_from_step once
    original = {"train/loss": [(4, 0.8), (6, 0.6)], "eval/loss": [(6, 0.7)], "resumed_from_step": [(0, 4.0)]}
    rerun = {"train/loss": [(2, 1.0), (4, 0.8), (6, 0.6)], "eval/loss": [(3, 0.9), (6, 0.7)], "first/only": [(1, 1.0)]}
    result = verdict("sft", {}, {}, original, rerun)
    assert result.identical, result.line()
    assert result.line() == "sft: identical (0 files, 2 metrics) (the original resumed at step 4: metrics compared from there)"


def test_a_failed_rerun_is_not_identical():
    assert not Verdict("dpo", failed="boom").identical
    assert Verdict("dpo", failed="boom").line() == "dpo: rerun failed: boom"


def test_overrides_are_split_where_a_new_key_begins():
    assert split_overrides("sft.lr=3e-4 seed=7") == ["sft.lr=3e-4", "seed=7"]
    assert split_overrides("eval.answer_pattern=Answer: (\\d+) rl.max_steps=2") == ["eval.answer_pattern=Answer: (\\d+)", "rl.max_steps=2"]
    assert split_overrides("") == []
