"""Which resumable checkpoints stay once one is saved (`{stage}.max_checkpoints`, OpenRLHF's --ckpt.max_num)."""

from __future__ import annotations

import pytest

from stages.common.deepspeed_engine import prune_old_tags, stale_tags

FOLDER = ["latest", "step10", "step2", "step30", "step20", "best", "zero_to_fp32.py"]


@pytest.mark.parametrize(("step", "keep", "stale"), [
    (30, 1, ["step2", "step10", "step20"]),
    (30, 2, ["step2", "step10"]),  # by step number, not by name (step10 sorts before step2 as text)
    (30, 4, []),
    (30, 9, []),
    (20, 2, ["step2", "step30"]),  # step30 is a killed run's, of a step this run does again
])
def test_the_newest_tags_up_to_the_saved_step_stay(step, keep, stale):
    assert stale_tags(FOLDER, step, keep) == stale


def test_pruning_deletes_the_stale_tag_folders_only(tmp_path):
    for name in ("step1", "step2", "step3", "best"):
        (tmp_path / name).mkdir()
    (tmp_path / "latest").write_text("step3")
    prune_old_tags(tmp_path, 3, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "latest", "step2", "step3"]
