"""A two-layer Llama of random weights (seeded), for exact loss and gradient comparisons."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny(cls=LlamaForCausalLM, attn="sdpa", **extra):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, pad_token_id=0, **extra)
    config._attn_implementation = attn
    return cls(config)


def tiny_llama() -> LlamaForCausalLM:
    """A seeded two-layer Llama of width 64 and a vocabulary of 100, for DeepSpeed engine checks."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, vocab_size=100))
