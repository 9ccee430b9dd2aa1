"""The rs stage on tiny data: rounds of sampling, best-of-n filtering and SFT on the kept samples in one
metric series, a killed run resuming without drawing its rounds again, and a threshold that keeps nothing
failing in one line. (The filter itself: tests/unit/test_training_methods.py.)"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from configs import load_config
from configs.errors import DataError
from stages.data.tokenization import IGNORE_INDEX
from stages.rs import stage as rs
from tests.stage.conftest import FAST, LENGTH_REWARD, Recorder, make_ctx

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

SHORT = [*FAST, "rs.enabled=true", "rs.rounds=2", "rs.max_steps=2", "rs.micro_batch_size=8", "rs.eval_every=2",
         "rs.save_every=1", "rs.lr=2e-3", "rs.prompts_per_round=8", "rs.samples_per_prompt=4", "rs.max_new_tokens=12"]


def run_rs(prepared, root, reward_file, extra=(), recorder=None):
    cfg = load_config(None, [*SHORT, f"reward.func_path={reward_file}", *extra])
    # the base model stands in for the SFT checkpoint: same format, no SFT run needed here
    inputs = {"sft_model": prepared["base_model"], "sft_data": prepared["sft_data"], "prompts": prepared["prompts"]}
    return rs.run(make_ctx("rs", cfg, root, recorder), inputs)


def test_rounds_train_on_each_prompts_best_sample_resume_and_refuse_a_threshold_keeping_none(prepared, tmp_path, capsys):
    reward_file = tmp_path / "length.py"
    reward_file.write_text(LENGTH_REWARD)
    killed = Recorder(fail_at=4)  # round 2's last step dies logging; its step 1 was saved
    with pytest.raises(KeyboardInterrupt):
        run_rs(prepared, tmp_path / "rs", reward_file, recorder=killed)
    rounds = [(s, m) for s, m in killed.rows if "round/kept" in m]
    assert [s for s, _ in rounds] == [0, 2]  # round 2 starts where round 1's 2 steps ended
    # the length reward: the best of 4 samples is longer than their mean; every prompt's best is kept
    assert all(m["round/kept"] == 8 and m["round/best_reward_mean"] > m["round/reward_mean"] for _, m in rounds)
    assert [s for s, m in killed.rows if "eval/loss" in m] == [2]
    first_policy = tmp_path / "rs" / "work" / "round0" / "policy" / "model.safetensors"
    written = first_policy.stat().st_mtime_ns
    capsys.readouterr()

    rec = Recorder()
    result = run_rs(prepared, tmp_path / "rs", reward_file, recorder=rec)
    out = capsys.readouterr().out
    assert "round 1/2" not in out and "round 2/2" not in out  # both rounds' samples reloaded, not drawn again
    assert "[rs] resumed from step 1/2" in out and first_policy.stat().st_mtime_ns == written
    assert [s for s, m in rec.rows if "train/loss" in m] == [4]
    for r in range(2):
        for ids, labels in torch.load(tmp_path / "rs" / "work" / f"round{r}" / "kept.pt")["rows"]:
            n_prompt = next(i for i, t in enumerate(labels) if t != IGNORE_INDEX)  # the prompt carries no loss
            assert n_prompt > 0 and labels[n_prompt:] == ids[n_prompt:]
    assert {"eval/loss", "train/loss", "round/kept_share"} <= set(result.metrics)
    assert AutoModelForCausalLM.from_pretrained(result.outputs["rs_model"]) is not None
    (tmp_path / "rs" / "output" / "rs_model").rename(tmp_path / "rs" / "first_output")  # killed after its last round
    again = run_rs(prepared, tmp_path / "rs", reward_file)
    assert again.metrics["eval/loss"] == result.metrics["eval/loss"]  # the last policy, reloaded

    with pytest.raises(DataError, match=r"^rs.threshold=1000000.0: round 1 kept no sample \(the best of 8 prompts x 4 "
                                        r"samples scored \d+\.\d{3}\); lower rs.threshold") as failed:
        run_rs(prepared, tmp_path / "strict", reward_file, ["rs.threshold=1e6"])
    assert "\n" not in str(failed.value) and not (tmp_path / "strict" / "work" / "round0" / "checkpoints").exists()
