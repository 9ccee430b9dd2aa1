"""The csft stage on tiny data: the SFT rows scored by the RM, each prompt conditioned on its (normalized)
score, the policy trained and saved with its target reward, and the eval stage prompting it with that
target while scoring the plain prompts. (The pure parts: tests/unit/test_training_methods.py.)"""

import pytest
import torch

from configs import load_config
from stages.common import checkpoint, conditioning
from stages.common.generation import generate
from stages.csft import stage as csft
from stages.data.prepared import read_split
from stages.eval import stage as evaluate
from stages.rewards.base import RewardBatch
from stages.rewards.rm_scorer import RewardModelScorer
from tests.stage.conftest import FAST, Recorder, make_ctx
from tests.tiny_checkpoint import save_random_rm

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

SHORT = [*FAST, "csft.enabled=true", "csft.max_steps=4", "csft.micro_batch_size=8", "csft.eval_every=4",
         "csft.save_every=100", "csft.lr=2e-3", "eval.max_samples=4", "eval.samples_per_prompt=0",
         "eval.max_new_tokens=8"]


class PromptsSeen:
    def __init__(self):
        self.prompts = []

    def score(self, prompts, responses, labels):
        self.prompts += prompts
        return RewardBatch(rewards=torch.zeros(len(prompts)))


def test_rows_are_conditioned_on_their_rm_scores_and_eval_prompts_with_the_target(prepared, tmp_path, monkeypatch):
    rm = save_random_rm(prepared["base_model"], tmp_path / "rm")
    cfg = load_config(None, [*SHORT, f"reward.rm_paths=[{rm}]"])
    rec = Recorder()
    result = csft.run(make_ctx("csft", cfg, tmp_path / "csft", rec),
                      {"sft_model": prepared["base_model"], "sft_data": prepared["sft_data"]})
    assert [s for s, m in rec.rows if "eval/loss" in m] == [4] and [s for s, m in rec.rows if "train/loss" in m] == [4]

    tokenizer = checkpoint.load_tokenizer(prepared["base_model"])
    rows = read_split(prepared["sft_data"], "train")
    saved = torch.load(tmp_path / "csft" / "work" / "scores.pt")
    assert saved["train"].shape == (len(rows),) and float(saved["train"].std()) > 0
    expected = RewardModelScorer([rm]).score([rows[0]["texts"][0]], [csft.response_text(tokenizer, rows[0]["texts"][1])], [None])
    assert float(saved["train"][0]) == pytest.approx(float(expected.rewards[0]), abs=1e-5)  # the RM scores the response as sampled

    out = result.outputs["csft_model"]
    assert conditioning.prompts_for(out, ["P"]) == ["P<rm_score>: 1.0\n"]
    seen, asked = PromptsSeen(), []

    def recording_generate(model, tokenizer, prompts, **options):  # the real generate, its prompts recorded
        asked.extend(prompts)
        return generate(model, tokenizer, prompts, **options)

    monkeypatch.setattr(evaluate, "generate", recording_generate)
    prompts = read_split(prepared["eval_data"], "eval")[:4]
    evaluate.evaluate_model(out, cfg, prompts, [], seen)
    assert asked == [p["prompt"] + "<rm_score>: 1.0\n" for p in prompts]  # the policy is prompted with the target
    assert seen.prompts == [p["prompt"] for p in prompts]  # the scorer sees the plain prompts
