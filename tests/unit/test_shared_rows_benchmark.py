"""`python -m benchmarks.shared_rows`: the policy's training step in shared and padded rows, side by side
on groups of responses to one prompt, agreeing to float rounding on identical weights."""

from __future__ import annotations

import json
import random

from benchmarks import shared_rows


def test_rows_come_in_groups_of_responses_to_one_prompt_within_the_profiles_lengths():
    rows = shared_rows.group_rows("long-prompt", groups=3, samples=4, rng=random.Random(0), vocab=96)
    assert len(rows) == 12 and len({tuple(p) for p, _ in rows}) == 3
    assert all(rows[i][0] == rows[i - i % 4][0] for i in range(12))
    assert all(len(p) == 256 and 32 <= len(r) <= 64 for p, r in rows)


def test_both_layouts_are_timed_and_agree_on_their_first_step(tmp_path, capsys):
    out = tmp_path / "shared-rows.json"
    assert shared_rows.main(["--steps", "1", "--profiles", "tiny", "even", "--groups", "2", "--samples", "3",
                             "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["dtype"], r["profile"]) for r in result["summary"]] == [("fp32", "tiny"), ("fp32", "even")]
    for row in result["summary"]:
        assert row["padded_tokens_per_s"] > 0 and row["shared_tokens_per_s"] > 0
        assert row["loss_gap"] < 1e-5 and row["grad_gap_relative"] < 1e-5
    assert "| fp32 | tiny (14 / 24) |" in capsys.readouterr().out
