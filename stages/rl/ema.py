"""The policy's exponential moving average (rl.actor.ema_beta; OpenRLHF's --enable_ema, --ema_beta): a copy of
its trained weights, moved toward them after every optimizer step, that the stage saves as its output.

Rank 0 keeps it on the host in fp32 (4 bytes a trained parameter): a step's (1 - beta) share of a change is
far below bf16's resolution, and the policy's device memory is left to training. Under ZeRO-3 every rank
takes part in each update, since each parameter is gathered by all of them."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch

from configs.errors import CheckpointError
from stages.common import checkpoint

EMA_FILE = "ema.pt"  # in a resumable checkpoint's tag folder, beside DeepSpeed's files (rank 0 writes it)


def moving_average(average: torch.Tensor, value: torch.Tensor, beta: float) -> torch.Tensor:
    """OpenRLHF's update: beta x `average` + (1 - beta) x `value` (beta 1: the average stays; 0: it is `value`)."""
    return beta * average + (1 - beta) * value


def gathered(param: torch.nn.Parameter, zero3: bool):
    """`param` whole for the block: a ZeRO-3 partition gathered from every rank (read only)."""
    if not zero3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=None)


class PolicyAverage:
    """The moving average of `module`'s trained (requires_grad) parameters, from their values now: rank 0's
    (`keeps`); every rank makes it and calls `update` (ZeRO-3: `zero3`)."""

    def __init__(self, module: torch.nn.Module, beta: float, zero3: bool, keeps: bool):
        self.beta, self.zero3, self.keeps = beta, zero3, keeps
        self.average: dict[str, torch.Tensor] = {}
        for name, param in self.trained(module):
            with gathered(param, zero3):
                if keeps:
                    self.average[name] = param.detach().float().cpu().clone()

    @staticmethod
    def trained(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        return [(name, p) for name, p in module.named_parameters() if p.requires_grad]

    def update(self, module: torch.nn.Module) -> None:
        """After an optimizer step: the average moves toward `module`'s new weights."""
        for name, param in self.trained(module):
            with gathered(param, self.zero3):
                if self.keeps:
                    self.average[name] = moving_average(self.average[name], param.detach().float().cpu(), self.beta)

    def applied(self, state: dict[str, torch.Tensor], module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """`module`'s whole state dict `state` (rank 0's) with the average in place of each trained parameter,
        under each name the state dict gives it (a tied weight has two), in the state's dtype."""
        first: dict[int, str] = {}
        for name, param in module.named_parameters(remove_duplicate=False):
            first.setdefault(id(param), name)  # the name named_parameters() gives, which the average goes by
        source = {name: first[id(p)] for name, p in module.named_parameters(remove_duplicate=False)
                  if first[id(p)] in self.average}
        cast: dict[str, torch.Tensor] = {}  # one tensor per parameter: a tied weight's names still share it
        out = {}
        for key, value in state.items():
            if key in source:
                value = cast.setdefault(source[key], self.average[source[key]].to(value.dtype))
            out[key] = value
        return out

    def save(self, tag_dir: Path, world_size: int) -> None:
        """Into a checkpoint's tag folder, before DeepSpeed's files and its `latest` (every rank calls)."""
        checkpoint.save_work_file(self.average, tag_dir / EMA_FILE, self.keeps, world_size)

    def load(self, tag_dir: Path) -> None:
        """The average a resumed run continues from (rank 0's; a no-op on the others)."""
        if not self.keeps:
            return
        path = tag_dir / EMA_FILE
        if not path.is_file():
            raise CheckpointError(f"rl.actor.ema_beta: the checkpoint {tag_dir} has no {EMA_FILE} to continue the "
                                  "policy's average from; delete the stage's work dir to start over")
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if set(saved) != set(self.average):
            raise CheckpointError(f"rl.actor.ema_beta: {path} averages other parameters than the policy trains; delete "
                                  "the stage's work dir to start over")
        self.average = saved
