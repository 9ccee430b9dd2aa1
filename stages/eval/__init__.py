"""Evaluation: every candidate model on the held-out sets, its metrics and the champion's score."""
