"""Model FLOPs utilisation on a CPU: achieved training FLOP/s (6 x parameters x tokens/s, attention left out)
over this machine's own fp32 matmul peak, measured with torch at the threads the trials use."""

from __future__ import annotations

import math
import time
from pathlib import Path

PEAK_SIZE = 2048  # square fp32 matmuls of this size reach the BLAS kernel's steady rate on a CPU


def threads() -> int:
    import torch

    return torch.get_num_threads()


def matmul_peak(size: int = PEAK_SIZE, repeats: int = 10) -> float:
    """FLOP/s of the best of `repeats` fp32 [size x size] @ [size x size] products (after one warm-up)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def count_params(model_dir: Path) -> int:
    """A checkpoint's parameters (a tied LM head counted once), from its config alone: the model is built on
    the meta device, so sharded and single-file checkpoints count alike and no weights are read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from stages.common.checkpoint_paths import resolve

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve(model_dir)))
    return sum(p.numel() for p in model.parameters())


def utilisation(result: dict, peak: float) -> float:
    """A trial's MFU: 6 x its model's parameters x its training tokens/s over `peak` FLOP/s."""
    return 6 * result["params"] * result["tokens_per_s"] / peak
