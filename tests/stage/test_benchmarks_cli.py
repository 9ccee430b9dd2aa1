"""`python -m benchmarks run sft`: our SFT stage and TRL's SFTTrainer side by side (TRL comes with the
bench extra only, so without it this is skipped)."""

import json

import pytest

pytest.importorskip("trl")

from benchmarks.__main__ import main  # noqa: E402


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
