"""LoRA for the training stages and the lora_merge stage: SFT, RM, PRM and DPO trained with adapters
save only the adapter; merging gives full checkpoints that plain transformers loads and whose logits
equal the adapter model's; an adapter is not merged onto a base it was not trained from."""

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from configs import CheckpointError, load_config
from stages.common import checkpoint_paths, lora
from stages.dpo import stage as dpo
from stages.lora_merge import stage as lora_merge
from stages.prm import stage as prm
from stages.rewards.rm_scorer import load_reward_model
from stages.rm import stage as reward_model
from stages.sft import stage as sft
from tests.stage.conftest import FAST, make_ctx

LORA = ["lora.rank=4", "lora.alpha=8", "max_steps=4", "eval_every=2", "save_every=2", "lr=5e-3"]
STAGES = {  # stage: (module, inputs from data_prep, output)
    "sft": (sft, {"base_model": "base_model", "sft_data": "sft_data"}, "sft_model"),
    "rm": (reward_model, {"sft_model": "base_model", "pref_data": "pref_data"}, "reward_model"),
    "prm": (prm, {"sft_model": "base_model", "prm_data": "prm_data"}, "prm"),
    "dpo": (dpo, {"sft_model": "base_model", "pref_data": "pref_data"}, "dpo_model"),
}


def train_with_lora(stage: str, prepared, root):
    module, inputs, output = STAGES[stage]
    cfg = load_config(None, [*FAST, *(f"{stage}.{o}" for o in LORA)])
    result = module.run(make_ctx(stage, cfg, root / stage), {k: prepared[v] for k, v in inputs.items()})
    return result.outputs[output]


@pytest.fixture(scope="module")
def adapters(prepared, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {stage: train_with_lora(stage, prepared, root) for stage in STAGES}


@pytest.fixture(scope="module")
def merged(adapters, prepared, tmp_path_factory):
    ctx = make_ctx("lora_merge", load_config(None, FAST), tmp_path_factory.mktemp("merge"))
    inputs = {STAGES[s][2]: path for s, path in adapters.items()} | {"rl_model": prepared["base_model"]}
    return lora_merge.run(ctx, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(STAGES))
def test_stage_with_lora_saves_only_an_adapter_on_its_base(adapters, prepared, stage):
    path = adapters[stage]
    assert checkpoint_paths.is_adapter(path) and not (path / "model.safetensors").exists()
    assert json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"] == str(prepared["base_model"])
    base = (AutoModelForSequenceClassification.from_pretrained(prepared["base_model"], num_labels=1) if stage == "rm"
            else AutoModelForCausalLM.from_pretrained(prepared["base_model"]))
    assert lora.read_extra(path)["base_signature"] == lora.base_signature(base)
    weights = load_file(path / "adapter_model.safetensors")
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in weights.items())  # it trained


@pytest.mark.slow
def test_merge_stage_merges_every_adapter_and_reports_the_logit_check(merged):
    out = merged.outputs["merged_models"]
    assert sorted(p.name for p in out.iterdir()) == ["dpo_model", "prm", "reward_model", "sft_model"]  # rl_model: a full model
    assert merged.metrics["merge/models"] == 4 and merged.metrics["merge/max_logit_diff"] < 1e-4


@pytest.mark.parametrize("stage", ["sft", "prm", "dpo"])
def test_merged_causal_lm_loads_plainly_and_matches_the_adapter_model(adapters, merged, prepared, stage):
    output = STAGES[stage][2]
    model = AutoModelForCausalLM.from_pretrained(merged.outputs["merged_models"] / output).eval()
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(prepared["base_model"]), adapters[stage]).eval()
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        assert float((model(input_ids=ids).logits - adapter(input_ids=ids).logits).abs().max()) < 1e-4
    if stage == "prm":  # the step-scorer settings survive the merge
        assert model.config.prm_placeholder_token == "<|step|>"


def test_merged_reward_model_keeps_its_head_and_statistics(adapters, merged, prepared):
    path = merged.outputs["merged_models"] / "reward_model"
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    base = AutoModelForSequenceClassification.from_pretrained(prepared["base_model"], num_labels=1)
    base.config.pad_token_id = model.config.pad_token_id
    adapter = PeftModel.from_pretrained(base, adapters["rm"]).eval()
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        assert float((model(input_ids=ids).logits - adapter(input_ids=ids).logits).abs().max()) < 1e-4
    stats = lora.read_extra(adapters["rm"])["config_fields"]
    assert model.config.reward_mean == pytest.approx(stats["reward_mean"])
    scorer = load_reward_model(path, device="cpu")  # the pipeline's own RM loader reads it too
    assert scorer.mean == pytest.approx(stats["reward_mean"])


def test_merging_onto_another_base_is_refused(adapters, prepared, tmp_path):
    other = AutoModelForCausalLM.from_pretrained(prepared["base_model"])
    with torch.no_grad():
        other.model.embed_tokens.weight.add_(0.01)  # same architecture, different weights
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(CheckpointError, match=r"was trained on another base than .*other"):
        lora_merge.merge(adapters["sft"], tmp_path / "out", base=str(tmp_path / "other"))
    assert not (tmp_path / "out").exists()


def test_materialize_merges_an_adapter_once_and_passes_full_models_through(adapters, prepared, tmp_path):
    import shutil

    adapter = shutil.copytree(adapters["dpo"], tmp_path / "dpo_model")
    assert lora_merge.materialize(prepared["base_model"]) == prepared["base_model"]
    merged_path = lora_merge.materialize(adapter)
    assert merged_path == tmp_path / "dpo_model.merged" and (merged_path / "model.safetensors").exists()
    stamp = (merged_path / "model.safetensors").stat().st_mtime_ns
    assert lora_merge.materialize(adapter) == merged_path
    assert (merged_path / "model.safetensors").stat().st_mtime_ns == stamp


def test_stages_side_by_side_materialize_the_same_adapter_safely(adapters, tmp_path):
    """rm and prm consume the SFT adapter from two flow threads at once; transformers' loading patches
    are process-wide, so unguarded concurrent loads returned models with weights left on the meta device."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    adapter = shutil.copytree(adapters["sft"], tmp_path / "sft_model")
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: lora_merge.materialize(adapter), range(2)))
    assert paths[0] == paths[1]
    model = AutoModelForCausalLM.from_pretrained(paths[0])
    assert not any(t.is_meta for t in model.state_dict().values())
