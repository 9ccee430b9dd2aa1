"""`infra.precision` resolved where a model runs: `auto` means bf16 on a GPU that has it, fp32 on a CPU."""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str) -> str:
    """`infra.precision` as this process computes: `auto` is bf16 on a GPU torch sees that has it, else fp32
    (resolved in the worker, not on the driver, which may have no GPU)."""
    if precision != "auto":
        return precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def torch_dtype(precision: str) -> torch.dtype:
    return DTYPES[resolve_precision(precision)]
