"""lora.merged_weights: the HF state dict a rollout engine loads from a LoRA policy equals peft's own
merge (merge_and_unload) and leaves the adapter model untouched; the base signature ignores adapters."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from stages.common import lora


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True))


def test_merged_weights_equal_peft_merge_and_unload():
    base = tiny_llama()
    signature = lora.base_signature(base)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))  # random B: merging changes the weights
    state = {k: v.clone() for k, v in model.state_dict().items()}
    merged = lora.merged_weights(state, scaling=8 / 4)
    reference = model.merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    assert max(float((merged[k] - reference[k]).abs().max()) for k in reference) < 1e-6
    assert float((merged["model.layers.0.self_attn.q_proj.weight"] - state[
        "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]).abs().max()) > 1e-3
    assert lora.base_signature(tiny_llama()) == signature


def test_merged_weights_by_hand():
    a, b, w = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0], [4.0]]), torch.zeros(2, 2)
    state = {"base_model.model.proj.base_layer.weight": w, "base_model.model.proj.lora_A.default.weight": a,
             "base_model.model.proj.lora_B.default.weight": b, "base_model.model.norm.weight": torch.ones(2)}
    merged = lora.merged_weights(state, scaling=0.5)
    assert torch.equal(merged["proj.weight"], torch.tensor([[1.5, 3.0], [2.0, 4.0]]))  # 0.5 * B @ A
    assert torch.equal(merged["norm.weight"], torch.ones(2)) and set(merged) == {"proj.weight", "norm.weight"}
