"""`python -m benchmarks run sft|grpo`: our stages and TRL's trainers side by side (TRL comes with the
bench extra only, so without it this is skipped)."""

import json

import pytest

pytest.importorskip("trl")

from benchmarks.__main__ import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # minutes: whole benchmark runs of both systems


def test_sft_benchmark_reports_both_systems_and_their_ratio(tmp_path, capsys):
    out = tmp_path / "benchmarks.json"
    assert main(["run", "sft", "--steps", "3", "--repeats", "1", "--out", str(out)]) == 0

    sft = json.loads(out.read_text())["benchmarks"]["sft"]
    assert set(sft["systems"]) == {"ours", "trl"}
    assert all(s["tokens_per_s"] > 0 for s in sft["systems"].values())
    assert sft["ratio"]["tokens_per_s"] == pytest.approx(
        sft["systems"]["ours"]["tokens_per_s"] / sft["systems"]["trl"]["tokens_per_s"])
    # the same rows in the same order: both built batches with the same non-pad tokens
    ours, trl = sft["trials"]["ours"][0], sft["trials"]["trl"][0]
    assert ours["tokens"] == trl["tokens"] > 0
    assert (ours["steps"], ours["micro_batch_size"]) == (trl["steps"], trl["micro_batch_size"]) == (3, 32)
    assert "| ours / TRL |" in capsys.readouterr().out


def test_grpo_benchmark_times_both_systems_on_the_same_rollout_shape(tmp_path, capsys):
    out = tmp_path / "benchmarks.json"
    # a start policy of 40 SFT steps (not the benchmark's 300): it already answers in the task's format and
    # ends its responses, and nothing here depends on how well it does; the systems whose rows this checks
    # (an RL run in padded rows, `ours_padded`'s layout: tests/stage/test_rl_algorithms.py's dense-reward test)
    systems = ["ours", "ours_recompute", "ours_actors", "trl", "trl_ray"]
    assert main(["run", "grpo", "--steps", "1", "--repeats", "1", "--sft-steps", "40", "--systems", *systems,
                 "--out", str(out)]) == 0

    grpo = json.loads(out.read_text())["benchmarks"]["grpo"]
    assert list(grpo["trials"]) == systems
    ours, trl = grpo["trials"]["ours"][0], grpo["trials"]["trl"][0]
    assert ours["samples"] == trl["samples"] == 16 * 8  # one rollout step of the tiny preset's 16 prompts x 8
    for trial in (ours, trl):
        parts = sum(trial[f"{p}_s"] for p in ("generation", "reward", "experience", "training", "weight_sync"))
        assert trial["generation_s"] > 0 and trial["training_s"] > 0
        assert parts == pytest.approx(trial["seconds"], rel=1e-6)  # the split adds up to the timed loop
    assert trl["weight_sync_s"] == 0  # TRL samples from the model it trains
    assert grpo["ratio"]["samples_per_s"] == pytest.approx(ours["samples_per_s"] / trl["samples_per_s"])
    # ours runs as the preset does: the policy rank samples (nothing to sync) and keeps its sampling
    # log-probs as the old ones; the TRL's-work row recomputes them, as TRL does
    assert ours["settings"]["engine"] == "hybrid" and not ours["settings"]["recompute_old_log_probs"]
    assert ours["settings"]["sft_steps"] == 40
    assert ours["weight_sync_s"] < 1e-3
    same_work = grpo["trials"]["ours_recompute"][0]
    assert same_work["settings"]["recompute_old_log_probs"]
    assert grpo["ratios"]["ours_recompute/trl"]["samples_per_s"] == pytest.approx(same_work["samples_per_s"] / trl["samples_per_s"])
    actors = grpo["trials"]["ours_actors"][0]  # the engine-actor layout syncs the weights every step
    assert actors["settings"]["engine"] == "hf" and actors["weight_sync_s"] > 0
    assert grpo["ratios"]["ours_actors/ours"]["samples_per_s"] == pytest.approx(actors["samples_per_s"] / ours["samples_per_s"])
    printed = capsys.readouterr().out
    assert "| ours / TRL |" in printed and "| ours, TRL's work / TRL |" in printed
    assert "| ours, engine and reference actors / ours |" in printed
    # the control: TRL's own trial inside a Ray worker, timed the same way
    in_ray = grpo["trials"]["trl_ray"][0]
    assert in_ray["samples"] == trl["samples"] and in_ray["weight_sync_s"] == 0
    assert grpo["ratios"]["ours_recompute/trl_ray"]["samples_per_s"] == pytest.approx(
        same_work["samples_per_s"] / in_ray["samples_per_s"])
    assert "| TRL in a Ray worker / TRL |" in printed
