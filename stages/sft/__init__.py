"""Supervised fine-tuning: next-token loss on the response tokens."""
