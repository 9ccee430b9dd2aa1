"""Conditional SFT: rows conditioned on their reward score, then fine-tuned on."""
