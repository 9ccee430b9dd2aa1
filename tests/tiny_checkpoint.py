"""One-layer HF checkpoints for tests that need a local model directory: a causal LM with its own tokenizer, a
random scalar-head reward model on a given tokenizer."""

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from configs.schema import TinyModelConfig
from stages.common import checkpoint
from stages.data_prep.tiny_model import build_model, train_tokenizer


def save_tiny_checkpoint(corpus: list[str], out_dir: Path, vocab_size: int = 64, seed: int = 0) -> Path:
    tok = train_tokenizer(corpus, vocab_size)
    model = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2), tok, seed=seed)
    return checkpoint.save(model, tok, out_dir)


def save_random_rm(base_model: Path, out: Path) -> Path:
    """A random scalar-head RM on the base model's tokenizer: it scores every row differently."""
    tok = checkpoint.load_tokenizer(base_model)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                                       num_labels=1, pad_token_id=tok.pad_token_id))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
