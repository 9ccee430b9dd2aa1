"""Machinery shared by the stages: checkpoints, DeepSpeed engines, tokenization, generation, progress."""
