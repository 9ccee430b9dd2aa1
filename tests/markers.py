"""Marks the suite's modules share."""

from __future__ import annotations

import pytest
import torch

# a test of what a machine without CUDA does (a refusal, the sdpa fallback, no MFU): skipped on a GPU machine
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without CUDA does")
