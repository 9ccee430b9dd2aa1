"""Knowledge distillation: a teacher policy's token distributions distilled into a student."""
