"""Weight sync by broadcast: the policy's rank 0 and the rollout engines share a process group of their own
(gloo on CPU, NCCL on GPU; OpenRLHF's and verl's way into their engines), and each sync sends the weights
parameter by parameter in the engine's order, each straight into the engine's parameter. Nothing crosses
Ray's object store, and no rank holds a second whole copy (under ZeRO-3 each parameter is gathered on its
own). The group is not the policy ranks' default group, which DeepSpeed owns.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

JOIN_TIMEOUT_S = 120.0  # every member must reach the rendezvous within this
BACKENDS = ("gloo", "nccl")

Spec = tuple[str, tuple[int, ...], str]  # parameter name, shape, dtype name


class WeightGroup:
    """Rank 0 sends, every other rank receives."""

    def __init__(self, master: tuple[str, int], rank: int, world_size: int, backend: str,
                 timeout_s: float = JOIN_TIMEOUT_S):
        if backend not in BACKENDS:
            raise ValueError(f"weight group backend {backend!r}: one of {BACKENDS}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank = rank
        self.store = dist.TCPStore(master[0], master[1], world_size, rank == 0, timeout=timeout)
        self.group: dist.ProcessGroupNCCL | dist.ProcessGroupGloo
        if backend == "nccl":
            self.group = dist.ProcessGroupNCCL(self.store, rank, world_size, dist.ProcessGroupNCCL.Options())
        else:
            self.group = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """`tensor` from rank 0 into every other rank's `tensor`, in place."""
        # torch's stubs leave out the collectives that the c10d Backend binding has
        self.group.broadcast([tensor], dist.BroadcastOptions()).wait()  # type: ignore[union-attr]


TIED = {"lm_head.weight": "model.embed_tokens.weight"}  # an output head tied to the input embeddings
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def checkpoint_specs(model_dir: str) -> list[Spec]:
    """What a checkpoint holds, in its files' order, for an engine whose own parameters are not the
    checkpoint's (vLLM fuses q, k and v), with a tied output head named too: save_pretrained writes a tied
    weight once, and vLLM's CPU backend keeps its own repacked copy of the head, which a reload of the
    embeddings alone leaves stale."""
    import json
    from pathlib import Path

    from safetensors import safe_open
    from transformers import AutoConfig

    folder = Path(model_dir)
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    out: list[Spec] = []
    for name in files:
        with safe_open(str(folder / name), "pt") as f:
            for key in f.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                part = f.get_slice(key)
                out.append((key, tuple(part.get_shape()), SAFETENSORS_DTYPES[part.get_dtype()]))
    names = {name for name, _, _ in out}
    if getattr(AutoConfig.from_pretrained(folder), "tie_word_embeddings", False) and "lm_head.weight" not in names:
        _, shape, dtype = next(spec for spec in out if spec[0] == TIED["lm_head.weight"])
        out.append(("lm_head.weight", shape, dtype))
    return out


def specs(model: torch.nn.Module) -> list[Spec]:
    """What an engine's model takes, in the order it takes it: its parameters (a tied weight once)."""
    return [(name, tuple(p.shape), str(p.dtype).removeprefix("torch.")) for name, p in model.named_parameters()]


@torch.no_grad()
def receive(group: WeightGroup, model: torch.nn.Module, wanted: list[Spec]) -> None:
    """An engine's side: each parameter of `wanted` (this model's `specs`) broadcast into place."""
    params = dict(model.named_parameters())
    for name, _, _ in wanted:
        group.broadcast(params[name].data)


@torch.no_grad()
def send(group: WeightGroup | None, module: torch.nn.Module, wanted: list[Spec], zero3: bool,
         merged: dict[str, torch.Tensor] | None = None) -> None:
    """A policy rank's side, on every rank (a ZeRO-3 parameter is gathered by all of them); rank 0, the one
    with a `group`, broadcasts. `merged`: the weights to send instead of the module's (LoRA adapters merged
    in, on rank 0), each still one tensor at a time."""
    params = dict(module.named_parameters(remove_duplicate=False))  # a tied head under its own name too
    for name, _, dtype in wanted:
        if merged is not None:
            if group is not None:  # a ZeRO-3 gather lists a tied head once, under the embeddings' name
                tensor = merged[name] if name in merged else merged[TIED.get(name, name)]
                group.broadcast(to_engine(tensor, dtype, module))
            continue
        param = params[name]
        if zero3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                if group is not None:
                    group.broadcast(to_engine(param.data, dtype, module))
        elif group is not None:
            group.broadcast(to_engine(param.data, dtype, module))


def to_engine(tensor: torch.Tensor, dtype: str, module: torch.nn.Module) -> torch.Tensor:
    """The tensor as the engine holds it (its dtype), contiguous, on the device the group's backend reads."""
    device = next(module.parameters()).device
    return tensor.to(device=device, dtype=getattr(torch, dtype)).contiguous()
