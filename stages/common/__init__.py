"""Machinery shared by the training stages: checkpoints, DeepSpeed engines, LoRA, packing, generation, progress."""
