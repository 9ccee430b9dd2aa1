"""rl.best_metric (OpenRLHF's --ckpt.best_metric_key): which eval step is the best, and the work dir's exports
of the best policy across checkpoints and a resume."""

from __future__ import annotations

import pytest

from configs.errors import ConfigError
from stages.rl.best import BestFolder, BestStep


def test_the_best_is_the_first_step_with_the_highest_metric():
    best = BestStep("reward")
    offered = [best.offer(step, {"reward": r, "accuracy": 0.0}) for step, r in [(1, -0.5), (2, 0.25), (3, 0.25), (4, 0.0)]]
    assert offered == [True, True, False, False]  # a tie keeps the earlier step, as OpenRLHF's `>`
    assert (best.step, best.value, best.evals) == (2, 0.25, {"reward": 0.25, "accuracy": 0.0})
    assert BestStep.restored("reward", best.state()) == best
    assert BestStep.restored("reward", None) == BestStep("reward")


def test_a_metric_the_evals_do_not_report_is_one_line():
    with pytest.raises(ConfigError, match=r"^rl.best_metric=pass_at_k: the held-out evals do not report it .*they "
                                          r"report reward, sampled_reward\): pick one of those$"):
        BestStep("pass_at_k").offer(1, {"reward": 0.5, "sampled_reward": 0.4})


def export(folder: BestFolder, step: int) -> None:
    folder.tag(step).mkdir(parents=True)
    folder.exported(step)


def test_an_export_stays_until_a_checkpoint_records_a_newer_best(tmp_path):
    announced = []
    folder = BestFolder(tmp_path / "best", lambda path, tag: announced.append((path.name, tag)))
    export(folder, 1)
    folder.checkpointed(1)  # the checkpoint at step 2 records best step 1
    export(folder, 3)  # a newer best before the next checkpoint: a resume from step 2 still needs step 1's
    assert sorted(p.name for p in folder.path.iterdir()) == ["latest", "step1", "step3"]
    assert (folder.path / "latest").read_text() == "step3" and announced == [("best", "step1"), ("best", "step3")]
    export(folder, 4)  # step 3's export is needed by no checkpoint
    assert sorted(p.name for p in folder.path.iterdir()) == ["latest", "step1", "step4"]
    folder.checkpointed(4)
    assert sorted(p.name for p in folder.path.iterdir()) == ["latest", "step4"]


def test_a_resume_goes_on_from_the_checkpoints_best(tmp_path):
    folder = BestFolder(tmp_path / "best", lambda path, tag: None)
    export(folder, 1)
    folder.checkpointed(1)
    export(folder, 3)  # killed before the next checkpoint
    again = BestFolder(tmp_path / "best", lambda path, tag: None)
    assert again.resumed(1)
    assert sorted(p.name for p in folder.path.iterdir()) == ["latest", "step1"]
    assert (folder.path / "latest").read_text() == "step1"
    assert not again.resumed(5)  # its export is not here (another node's work dir): the caller forgets it
    assert again.resumed(None)
