"""Mixed into each vLLM worker (vLLM's `worker_extension_cls`): the rollout side of weight sync by broadcast,
inside the process that holds the model (a vLLM engine runs its workers in processes of their own, so the
engine actor joining the group would still pass every tensor on to them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class WeightReceiver:
    # the vLLM worker's own, which this class is mixed into (annotations only: nothing here shadows them)
    model_runner: Any
    reload_weights: Callable[..., None]

    def join_weight_group(self, master: tuple[str, int], rank: int, world_size: int, backend: str) -> None:
        from stages.rl.weight_sync import WeightGroup

        host, port = master  # a list once it has crossed Ray
        self.weight_group = WeightGroup((host, port), rank, world_size, backend)

    def receive_weights(self, wanted: list) -> None:
        """Each tensor of `wanted` (checkpoint names, shapes, dtypes) broadcast from the policy's rank 0, then
        the worker's own reload (which maps checkpoint names onto vLLM's fused parameters and redoes what the
        backend did to loaded weights, e.g. the CPU's repacking)."""
        import torch

        device = next(self.model_runner.model.parameters()).device
        received = []
        for name, shape, dtype in wanted:
            tensor = torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=device)
            self.weight_group.broadcast(tensor)
            received.append((name, tensor))
        self.reload_weights(weights_iterator=received, is_checkpoint_format=True)
