"""Liger's Triton kernels in the causal LMs the stages load (model.use_liger_kernel, OpenRLHF's
--ds.use_liger_kernel): RMSNorm, rotary embeddings and SwiGLU replaced in the loaded model by liger-kernel.

Triton runs on a CUDA GPU only, and liger-kernel is in the `gpu` extra: it is imported here, on that path
alone. Its fused linear cross-entropy is left off: it acts only where the model is given labels, and every
stage computes its loss from the logits (the log-probs of RL, DPO's sequence sums, SFT's masked tokens)."""

from __future__ import annotations

import torch

from configs.errors import CheckpointError

KEY = "model.use_liger_kernel"


def require() -> None:
    """A CUDA GPU and liger-kernel, or a one-line error saying which is missing."""
    if not torch.cuda.is_available():
        raise CheckpointError(f"{KEY} needs a CUDA GPU (Liger's kernels are Triton) and this machine has none; "
                              f"set {KEY}=false")
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        raise CheckpointError(f"{KEY} needs liger-kernel: pip install 'rlhf-pipeline[gpu]'") from None


def apply(model: torch.nn.Module) -> None:
    """Liger's kernels in `model`'s modules (before LoRA wraps them or DeepSpeed takes the model); a model family
    Liger has no kernels for is a one-line error."""
    require()
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise CheckpointError(f"{KEY}: Liger has no kernels for model_type {model_type!r} (it has them for "
                              f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); set {KEY}=false")
    _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=False)
