import json

from stages import eval_results, evaluate
from tests.stage.conftest import make_ctx


def test_eval_reports_every_model_it_is_given(fast_config, prepared, tmp_path):
    inputs = {
        "base_model": prepared["base_model"],
        "sft_model": prepared["base_model"],  # same weights under a second name: identical numbers expected
        "sft_data": prepared["sft_data"],
        "eval_data": prepared["eval_data"],
    }
    logged = {}
    result = evaluate.run(make_ctx("eval", fast_config, tmp_path, lambda m, s: logged.update(m)), inputs)
    report = result.outputs["eval_report"]
    results = json.loads((report / "results.json").read_text())
    assert list(results) == ["base", "sft"]
    assert results["base"] == results["sft"]
    assert results["base"]["accuracy"] == 0.0  # an untrained model does not do arithmetic
    assert 0 < results["base"]["response_length"] <= fast_config.eval.max_new_tokens
    assert results["base"]["perplexity"] > 1.0
    assert "| base |" in (report / "results.md").read_text()
    samples = [json.loads(line) for line in open(report / "samples_sft.jsonl")]
    assert len(samples) == fast_config.eval.max_samples
    assert logged["sft/accuracy"] == result.metrics["accuracy"] == results["sft"]["accuracy"]


def test_model_inputs_keep_pipeline_order(tmp_path):
    got = eval_results.model_inputs({"base_model": tmp_path / "b", "sft_data": tmp_path, "sft_model": tmp_path / "s"})
    assert list(got) == ["base", "sft"]
