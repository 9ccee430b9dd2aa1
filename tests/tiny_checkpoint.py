"""A one-layer HF checkpoint with its own tokenizer, for tests that need a local model directory."""

from pathlib import Path

from configs.schema import TinyModelConfig
from stages.common import checkpoint
from stages.data_prep.tiny_model import build_model, train_tokenizer


def save_tiny_checkpoint(corpus: list[str], out_dir: Path, vocab_size: int = 64, seed: int = 0) -> Path:
    tok = train_tokenizer(corpus, vocab_size)
    model = build_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2), tok, seed=seed)
    return checkpoint.save(model, tok, out_dir)
