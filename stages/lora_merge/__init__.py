"""LoRA merge: adapters folded into their base model."""
