"""Reward model training: a scalar head on pairwise preferences."""
