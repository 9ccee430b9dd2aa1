"""The kd stage on tiny data: a fresh student half the teacher's size moves toward the teacher's
distributions (the eval KL falls), logs the scheme's metrics, saves an HF checkpoint of its own shape,
and a teacher with another tokenizer fails in one line before training. (The divergences:
tests/unit/test_training_methods.py.)"""

import pytest
from transformers import AutoConfig

from configs import load_config
from configs.errors import CheckpointError
from stages.common import checkpoint
from stages.data_prep import tiny_model
from stages.kd import stage as kd
from tests.stage.conftest import FAST, Recorder, make_ctx

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

SHORT = [*FAST, "kd.enabled=true", "kd.teacher=dpo", "kd.student=tiny", "kd.kd_coef=1.0", "kd.max_steps=4",
         "kd.micro_batch_size=8", "kd.eval_every=2", "kd.save_every=100", "kd.lr=3e-3", "kd.warmup_ratio=0"]


def test_a_fresh_student_learns_the_teachers_distributions_and_another_tokenizer_is_refused(prepared, tmp_path):
    rec = Recorder()
    inputs = {"sft_model": prepared["base_model"], "sft_data": prepared["sft_data"],
              "dpo_model": prepared["base_model"]}  # the base model stands in for the DPO teacher
    result = kd.run(make_ctx("kd", load_config(None, SHORT), tmp_path / "kd", rec), inputs)
    evals = [(s, m["eval/kl"]) for s, m in rec.rows if "eval/kl" in m]
    assert [s for s, _ in evals] == [2, 4] and evals[-1][1] < evals[0][1] / 2
    assert {"train/loss", "train/nll", "train/kl", "eval/loss"} <= set(rec.rows[-1][1]) | set(rec.rows[-2][1])
    assert result.metrics["eval/kl"] == evals[-1][1]
    student = AutoConfig.from_pretrained(result.outputs["kd_model"])
    assert (student.hidden_size, student.num_hidden_layers) == (64, 2)  # kd.student_tiny's defaults

    other = tmp_path / "other_teacher"  # the same architecture, its own tokenizer
    tokenizer = tiny_model.train_tokenizer(["Compute 12+7 = 19. Answer: 19"] * 20, 40)
    checkpoint.save(tiny_model.build_model(load_config(None, []).model.tiny, tokenizer, 0), tokenizer, other)
    cfg = load_config(None, [*SHORT, "kd.teacher=path", f"kd.teacher_path={other}"])
    with pytest.raises(CheckpointError, match=rf"^kd.teacher_path={other}: the teacher's tokenizer differs from the "
                                              r"student's \(a fresh kd.student_tiny model\): its (logits cover|vocabulary "
                                              r"has) \d+ tokens, the student's \d+; distil a teacher") as failed:
        kd.run(make_ctx("kd", cfg, tmp_path / "refused", None), inputs)
    assert "\n" not in str(failed.value) and not (tmp_path / "refused" / "work" / "checkpoints").exists()
