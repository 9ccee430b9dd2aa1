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
    """Parameters stored in a checkpoint's model.safetensors (a tied LM head counted once)."""
    from safetensors import safe_open

    from stages.common.checkpoint_paths import resolve

    with safe_open(str(Path(resolve(model_dir)) / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def utilisation(result: dict, peak: float) -> float:
    """A trial's MFU: 6 x its model's parameters x its training tokens/s over `peak` FLOP/s."""
    return 6 * result["params"] * result["tokens_per_s"] / peak
