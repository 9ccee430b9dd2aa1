"""Rejection sampling: best-of-n answers scored by the reward, then fine-tuned on."""
