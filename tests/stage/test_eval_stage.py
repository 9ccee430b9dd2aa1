import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from configs import ConfigError, load_config
from stages.eval import results as eval_results
from stages.eval import stage as evaluate
from stages.rewards.rm_scorer import RewardModelScorer
from tests.stage.conftest import FAST, make_ctx

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

# A free-form task's reward: the response's length in characters (not 0/1, no answer to check).
LENGTH_REWARD = "def reward_func(queries, prompts, labels):\n    return [len(q) - len(p) for q, p in zip(queries, prompts)]\n"
SMALL = [*FAST, "eval.max_samples=8", "eval.max_new_tokens=12", "eval.samples_per_prompt=2"]


def test_eval_reports_every_model_it_is_given(prepared, tmp_path):
    cfg = load_config(None, SMALL)
    inputs = {
        "base_model": prepared["base_model"],
        "sft_model": prepared["base_model"],  # same weights under a second name: identical numbers expected
        "sft_data": prepared["sft_data"],
        "eval_data": prepared["eval_data"],
    }
    logged = {}
    result = evaluate.run(make_ctx("eval", cfg, tmp_path, lambda m, s: logged.update(m)), inputs)
    report = result.outputs["eval_report"]
    results = json.loads((report / "results.json").read_text())
    assert list(results) == ["base", "sft"]
    assert results["base"] == results["sft"]
    # an untrained model does not do arithmetic: the preset's 0/1 reward and the regex agree on it
    assert results["base"]["accuracy"] == results["base"]["reward"] == 0.0
    assert results["base"]["sampled_reward"] == results["base"]["pass_at_k"] == 0.0
    assert 0 < results["base"]["response_length"] <= cfg.eval.max_new_tokens
    assert results["base"]["perplexity"] > 1.0
    assert (report / "results.md").read_text().startswith("| model | **reward** | sampled reward | pass@k | accuracy |")
    samples = [json.loads(line) for line in (report / "samples_sft.jsonl").read_text().splitlines()]
    assert len(samples) == cfg.eval.max_samples
    assert {s["reward"] for s in samples} == {0.0} and not any(s["correct"] for s in samples)
    assert logged["sft/reward"] == result.metrics["score"] == results["sft"]["reward"]
    assert logged["sft/sampled_reward"] == results["sft"]["sampled_reward"]


def test_eval_scores_a_free_form_task_with_its_reward_function(prepared, tmp_path):
    """No answer_pattern, a reward that is not 0/1: reward and sampled reward, no accuracy, no pass@k;
    each response's reward in the samples file."""
    func = tmp_path / "length.py"
    func.write_text(LENGTH_REWARD)
    cfg = load_config(None, [*SMALL, f"reward.func_path={func}", "eval.answer_pattern=null", "eval.metric=sampled_reward"])
    inputs = {"sft_model": prepared["base_model"], "eval_data": prepared["eval_data"]}
    logged = {}
    result = evaluate.run(make_ctx("eval", cfg, tmp_path, lambda m, s: logged.update(m)), inputs)
    report = result.outputs["eval_report"]
    samples = [json.loads(line) for line in (report / "samples_sft.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all(s["reward"] == len(s["response"]) for s in samples)
    assert "answer" not in samples[0] and "correct" not in samples[0]
    assert logged["sft/reward"] == pytest.approx(sum(s["reward"] for s in samples) / 8)
    assert logged["sft/sampled_reward"] > 0
    assert result.metrics["score"] == logged["sft/sampled_reward"]  # the key metric follows eval.metric
    assert not {"sft/accuracy", "sft/sampled_accuracy", "sft/pass_at_k"} & set(logged)
    assert (report / "results.md").read_text().startswith("| model | **sampled reward** | reward | response length |")

    pass_at_k = load_config(None, [*SMALL, f"reward.func_path={func}", "eval.metric=pass_at_k"])
    with pytest.raises(ConfigError, match=rf"^eval.metric=pass_at_k: the sampled rewards of reward.func_path={func} "
                                          "are not all 0 or 1"):
        evaluate.run(make_ctx("eval", pass_at_k, tmp_path / "p"), inputs)


def test_eval_scores_with_the_pipelines_own_reward_model(prepared, tmp_path):
    """reward.source=rm without rm_paths: the `reward_model` input scores the responses (and is no model
    to evaluate); the samples' rewards are the RM's."""
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(prepared["base_model"])
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id)
    rm = tmp_path / "reward_model"
    LlamaForSequenceClassification(config).save_pretrained(rm)
    tok.save_pretrained(rm)
    cfg = load_config(None, [*SMALL, "reward.source=rm", "eval.samples_per_prompt=1"])
    inputs = {"sft_model": prepared["base_model"], "eval_data": prepared["eval_data"], "reward_model": rm}
    result = evaluate.run(make_ctx("eval", cfg, tmp_path), inputs)
    assert {key.partition("/")[0] for key in result.metrics if "/" in key} == {"sft"}
    samples = [json.loads(line) for line in (result.outputs["eval_report"] / "samples_sft.jsonl").read_text().splitlines()]
    expected = RewardModelScorer([rm]).score([s["prompt"] for s in samples], [s["response"] for s in samples],
                                             [s["label"] for s in samples]).rewards
    assert [s["reward"] for s in samples] == pytest.approx(expected.tolist(), abs=1e-6)
    assert len({round(s["reward"], 6) for s in samples}) > 1  # a real score, not a constant
    assert result.metrics["sft/reward"] == pytest.approx(float(expected.double().mean()), abs=1e-6)


def test_model_inputs_keep_pipeline_order_and_leave_out_the_reward_models(tmp_path):
    got = eval_results.model_inputs({"base_model": tmp_path / "b", "sft_data": tmp_path, "sft_model": tmp_path / "s",
                                     "reward_model": tmp_path / "r", "prm": tmp_path / "p"})
    assert list(got) == ["base", "sft"]
