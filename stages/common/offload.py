"""Frozen models kept off the compute device between uses (OpenRLHF's --ref.offload and --reward.offload).

An offloaded model's weights live in host memory (pinned where CUDA is, so the copies to the GPU are fast)
and go to the compute device only for the block that runs its forward passes. They never change, so
nothing is copied back: each parameter's data is pointed at its device copy for the block and at its host
copy after it, and the device copies are freed. OpenRLHF sets ZeRO-3's `offload_param` in the DeepSpeed
inference engine that holds such a model (it acts under --zero_stage 3); here the reference and reward
models are plain HF modules that no DeepSpeed engine holds, so torch moves their parameters, under any ZeRO
stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)


def host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in host memory: pinned where CUDA is (page-locked memory is what an asynchronous copy needs)."""
    host = tensor.detach().to("cpu")
    return host.pin_memory() if torch.cuda.is_available() else host


def device_copy(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` on `device` (asynchronous from pinned memory; the host tensor itself where `device` is the CPU)."""
    return host.to(device, non_blocking=True)


class FrozenModel(Generic[M]):
    """A frozen module and where it computes. Without offload it stays on `device`; with it, its weights stay
    in host memory and `use()` lends them to `device` for a block."""

    def __init__(self, module: M, device: str | torch.device, offload: bool = False):
        self.module, self.device, self.offload = module, torch.device(device), offload
        self.lent = 0  # blocks the weights went to the device for
        if not offload:
            self.module.to(self.device)
            self.hosted: list[tuple[torch.Tensor, torch.Tensor]] = []
            return
        # each parameter and buffer once (tied weights are one Parameter), with its host copy
        tensors = [*module.parameters(), *module.buffers()]
        self.hosted = [(t, host_copy(t)) for t in {id(t): t for t in tensors}.values()]
        self._point_at_host()

    @property
    def weights_device(self) -> torch.device:
        """Where the weights are now: the host between uses when offloaded."""
        return next(self.module.parameters()).device

    @contextmanager
    def use(self) -> Iterator[M]:
        """The module on `device` for the block; an offloaded one goes back to host memory after it."""
        if not self.offload:
            yield self.module
            return
        self.lent += 1
        for tensor, host in self.hosted:
            tensor.data = device_copy(host, self.device)
        try:
            yield self.module
        finally:
            self._point_at_host()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # the freed copies go back to the GPU, for the models that share it

    def _point_at_host(self) -> None:
        for tensor, host in self.hosted:
            tensor.data = host
