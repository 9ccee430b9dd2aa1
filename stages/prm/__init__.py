"""Process reward model training: step-level labels at the step tags."""
