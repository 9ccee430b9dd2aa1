"""The rm and prm stages on tiny data: checkpoints HF loads, equal to the project's scorers, stats and
step-label config recorded, metrics logged per eval step. (Accuracy on the real preset: flow tests.)"""

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from configs import load_config
from stages.data.prepared import read_split
from stages.prm import stage as prm
from stages.rewards.prm_scorer import ProcessRewardScorer
from stages.rewards.rm_scorer import RewardModelScorer
from stages.rm import stage as reward_model
from tests.stage.conftest import FAST, make_ctx

SHORT = [*FAST, "rm.max_steps=10", "rm.eval_every=5", "rm.save_every=5", "prm.max_steps=10", "prm.eval_every=5", "prm.save_every=5"]


def run_rm(prepared, root, extra=()):
    cfg = load_config(None, [*SHORT, *extra])
    logged = []
    ctx = make_ctx("rm", cfg, root, lambda m, s: logged.append((s, m)))
    # the base model stands in for the SFT checkpoint: same format, no SFT run needed here
    result = reward_model.run(ctx, {"sft_model": prepared["base_model"], "pref_data": prepared["pref_data"]})
    return result, logged


@pytest.fixture(scope="module")
def rm_result(prepared, tmp_path_factory):
    return run_rm(prepared, tmp_path_factory.mktemp("rm"))


@pytest.mark.slow
def test_rm_logs_pairwise_accuracy_and_margin_per_eval_step(rm_result):
    result, logged = rm_result
    assert [s for s, m in logged if "eval/accuracy" in m] == [5, 10]
    assert {"eval/accuracy", "eval/margin", "eval/loss"} <= set(logged[-1][1])
    assert 0.0 <= result.metrics["eval/accuracy"] <= 1.0
    assert result.metrics["eval/reward_std"] > 0


def test_rm_checkpoint_loads_as_hf_sequence_classifier_and_matches_the_scorer(rm_result, prepared):
    result, _ = rm_result
    path = result.outputs["reward_model"]
    config = json.loads((path / "config.json").read_text())
    assert config["value_head_prefix"] == "score" and config["normalize_reward"] is False
    assert config["reward_mean"] == pytest.approx(result.metrics["eval/reward_mean"])
    hf = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
    tok = AutoTokenizer.from_pretrained(path)
    rows = read_split(prepared["pref_data"], "eval")[:12]
    prompts = [r["prompt"] for r in rows] * 2
    responses = [r["chosen"] for r in rows] + [r["rejected"] for r in rows]
    ours = RewardModelScorer([path], batch_size=5).score(prompts, responses, [None] * len(prompts)).rewards
    with torch.no_grad():
        theirs = torch.cat([
            hf(**tok(p + r, return_tensors="pt", add_special_tokens=False)).logits[:, 0] for p, r in zip(prompts, responses)
        ])
    assert float((ours - theirs).abs().max()) < 1e-4


@pytest.mark.slow
def test_rm_head_prefix_and_normalisation_follow_the_config(prepared, tmp_path, rm_result):
    result, _ = run_rm(prepared, tmp_path, ["rm.value_head_prefix=value_head", "rm.normalize_reward=true"])
    path = result.outputs["reward_model"]
    assert json.loads((path / "config.json").read_text())["value_head_prefix"] == "value_head"
    rows = read_split(prepared["pref_data"], "eval")[:8]
    prompts, responses = [r["prompt"] for r in rows], [r["chosen"] for r in rows]
    normalized = RewardModelScorer([path]).score(prompts, responses, [None] * 8).rewards
    raw = RewardModelScorer([rm_result[0].outputs["reward_model"]]).score(prompts, responses, [None] * 8).rewards
    # same seed, same data: the same weights; only the normalisation differs
    m, s = result.metrics["eval/reward_mean"], result.metrics["eval/reward_std"]
    assert torch.allclose(normalized, (raw - m) / s, atol=1e-4)


@pytest.mark.slow
def test_prm_stage_writes_a_checkpoint_the_step_scorer_reads(prepared, tmp_path):
    cfg = load_config(None, SHORT)
    logged = []
    result = prm.run(make_ctx("prm", cfg, tmp_path, lambda m, s: logged.append((s, m))),
                     {"sft_model": prepared["base_model"], "prm_data": prepared["prm_data"]})
    assert [s for s, m in logged if "eval/step_accuracy" in m] == [5, 10]
    path = result.outputs["prm"]
    config = json.loads((path / "config.json").read_text())
    assert config["prm_placeholder_token"] == "<|step|>" and config["prm_reward_tokens"] == ["+", "-"]
    rows = read_split(prepared["prm_data"], "eval")[:4]
    scorer = ProcessRewardScorer(path, aggregate="min")
    steps = scorer.step_scores([r["prompt"] for r in rows], [r["response"] for r in rows])
    assert [len(s) for s in steps] == [len(r["labels"]) for r in rows]
    assert all(0.0 < p < 1.0 for s in steps for p in s)


@pytest.mark.slow
def test_rm_with_lora_trains_and_saves_only_an_adapter_that_peft_loads(prepared, tmp_path):
    from peft import PeftModel

    from stages.common.checkpoint_paths import is_adapter

    result, _ = run_rm(prepared, tmp_path, ["rm.lora.rank=4", "rm.lora.alpha=8", "rm.lr=5e-3"])
    path = result.outputs["reward_model"]
    assert is_adapter(path) and not (path / "model.safetensors").exists()
    adapter_cfg = json.loads((path / "adapter_config.json").read_text())
    assert adapter_cfg["r"] == 4 and adapter_cfg["base_model_name_or_path"] == str(prepared["base_model"])
    stats = json.loads((path / "adapter_extra.json").read_text())["config_fields"]
    assert stats["reward_mean"] == pytest.approx(result.metrics["eval/reward_mean"])

    base = AutoModelForSequenceClassification.from_pretrained(prepared["base_model"], num_labels=1)
    model = PeftModel.from_pretrained(base, path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    rows = read_split(prepared["pref_data"], "eval")
    with torch.no_grad():
        def reward(text):
            return float(model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0])
        acc = sum(reward(r["prompt"] + r["chosen"]) > reward(r["prompt"] + r["rejected"]) for r in rows) / len(rows)
    # the reloaded adapter scores the eval pairs exactly as the stage's final eval did
    assert acc == pytest.approx(result.metrics["eval/accuracy"])


def test_a_placeholder_the_tokenizer_lacks_is_added_by_data_prep_and_the_prm_trains_on_it(tmp_path):
    """A real checkpoint's tokenizer splits `<|step|>`-style placeholders: data prep adds it as one
    special token and resizes the embeddings, so the PRM stage runs on `model.name_or_path`."""
    from stages.common import checkpoint
    from stages.data_prep import stage as data_prep
    from tests.tiny_checkpoint import save_tiny_checkpoint

    local = save_tiny_checkpoint(["Compute 1+2\n1+2=3\nAnswer: 3"] * 4, tmp_path / "model")
    token = "<|reward_here|>"
    assert len(checkpoint.load_tokenizer(local)(token, add_special_tokens=False)["input_ids"]) > 1
    cfg = load_config(None, [*SHORT, f"model.name_or_path={local}", f"prm.placeholder_token={token}",
                             "data.synthetic.num_train=80", "prm.max_steps=2", "prm.eval_every=2"])
    prepared = data_prep.run(make_ctx("data_prep", cfg, tmp_path / "prep"), {}).outputs
    tokenizer = checkpoint.load_tokenizer(prepared["base_model"])
    assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    model = checkpoint.load_causal_lm(prepared["base_model"], cfg.model)
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert token in read_split(prepared["prm_data"], "train")[0]["response"]
    result = prm.run(make_ctx("prm", cfg, tmp_path / "prm"),
                     {"sft_model": prepared["base_model"], "prm_data": prepared["prm_data"]})
    assert json.loads((result.outputs["prm"] / "config.json").read_text())["prm_placeholder_token"] == token
