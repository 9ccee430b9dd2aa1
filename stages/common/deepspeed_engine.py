"""DeepSpeed engines for the training stages: config from the pipeline's infra section,
resumable checkpoints (model, optimizer, scheduler, step, RNG) and HF export (ZeRO-3 gathered)."""

from __future__ import annotations

import gc
import os
import random
import re
import sys
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from configs.schema import InfraConfig, OptimConfig, TrainingConfig
from stages.common import worker_imports
from stages.common.precision import resolve_precision

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine as Engine  # deepspeed ships no types: Any to mypy


RESUME_TAG = "latest"
# every engine this process made and has not released: DeepSpeed's hooks keep an engine (and its model,
# gradients and optimizer state) reachable after the stage that made it returns, until `destroy`
_ENGINES: weakref.WeakSet = weakref.WeakSet()
SHM_COMM_OP = "deepspeed_shm_comm"  # DeepSpeed's ShareMemCommBuilder.NAME


def import_deepspeed() -> None:
    """Import DeepSpeed without MLflow: its autotuner, which no stage runs, imports MLflow wherever it is
    installed, two seconds of the start of every process that trains (a policy or critic rank logs
    nothing to MLflow; a stage worker imports it later, for its metrics)."""
    if "deepspeed" in sys.modules:
        return
    with worker_imports.absent_while_importing("mlflow"):
        import deepspeed  # noqa: F401


def init_distributed() -> None:
    """Join the process group the launcher described in the environment (gloo on CPU, nccl on GPU)."""
    import_deepspeed()
    import deepspeed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    # DeepSpeed would compile its shared-memory all-reduce kernel here (a long build, again for every new
    # virtualenv path); it serves only inference_all_reduce (AutoTP inference),
    # while training's collectives go through torch.distributed. DeepSpeed keeps edits to this dict.
    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


def zero_config(infra: InfraConfig) -> dict[str, Any]:
    """ZeRO stage, offload of optimizer state (ZeRO-Offload) and of ZeRO-3 parameters to the CPU,
    and overlapping the gradient reduction with the backward pass."""
    zero: dict[str, Any] = {"stage": infra.zero_stage, "overlap_comm": infra.overlap_comm}
    pin = torch.cuda.is_available()  # pinned host memory speeds up GPU<->CPU copies; there is none without a GPU
    if infra.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if infra.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    return zero


def scheduler_config(train: OptimConfig, total_steps: int) -> dict[str, Any] | None:
    """DeepSpeed's scheduler for `train.lr_scheduler` (HF's names, as OpenRLHF takes them); None for a constant lr
    (a scheduler would still spend its first step at lr 0). DeepSpeed's warm-up lasts at least one step."""
    if train.constant_lr:
        return None
    warmup = max(1, int(train.warmup_ratio * total_steps))
    if train.lr_scheduler == "cosine_with_min_lr":
        return {"type": "WarmupCosineLR", "params": {"total_num_steps": max(total_steps, 1), "warmup_num_steps": warmup,
                                                     "warmup_min_ratio": 0.0, "cos_min_ratio": train.min_lr_ratio,
                                                     "warmup_type": "linear"}}
    ramp = {"warmup_min_lr": 0.0, "warmup_max_lr": train.lr, "warmup_num_steps": warmup, "warmup_type": "linear"}
    if train.lr_scheduler == "constant_with_warmup":
        return {"type": "WarmupLR", "params": ramp}
    return {"type": "WarmupDecayLR", "params": {"total_num_steps": max(total_steps, 1), **ramp}}  # linear


def engine_config(infra: InfraConfig, train: TrainingConfig, total_steps: int) -> dict[str, Any]:
    """The DeepSpeed JSON config: AdamW (torch's fused implementation, which runs on CPU and GPU) and the
    learning-rate schedule (`scheduler_config`)."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_accumulation_steps": train.grad_accum_steps,
        "gradient_clipping": train.grad_clip,
        "zero_optimization": zero_config(infra),
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": train.lr, "weight_decay": train.weight_decay, "betas": list(train.adam_betas), "torch_adam": True,
                       "fused": True},  # one kernel for all tensors (TRL's adamw_torch_fused): faster steps
        },
        # with offload, DeepSpeed's CPU Adam (a compiled op) is faster, but torch's runs everywhere
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,  # progress is ours; keep DeepSpeed's own log quiet
        "wall_clock_breakdown": False,
    }
    scheduler = scheduler_config(train, total_steps)
    if scheduler is not None:
        config["scheduler"] = scheduler
    precision = resolve_precision(infra.precision)
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True}
    return config


def initialize(model: torch.nn.Module, config: dict[str, Any]):
    import_deepspeed()
    import deepspeed

    import_muon_uncompiled()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    _ENGINES.add(engine)
    return engine


def step(engine: Engine) -> float | None:
    """`engine.step()`; at an optimizer step, the 2-norm of the step's gradients before clipping (None between
    accumulation micro-steps, or where nothing measures it). DeepSpeed's ZeRO and mixed-precision optimizers
    compute it; its plain fp32 path does not, and there each rank holds the whole averaged gradients, so they
    are measured here before the step clears them."""
    boundary = engine.is_gradient_accumulation_boundary()
    own = None
    if boundary and not engine.zero_optimization() and not (engine.bfloat16_enabled() or engine.fp16_enabled()):
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        own = float(torch.nn.utils.get_total_norm(grads)) if grads else None
    engine.step()
    if not boundary:
        return None
    norm = engine.get_global_grad_norm() if own is None else own
    return None if norm is None else float(norm)


def release_engines() -> int:
    """Destroy every engine this process still holds, so that the next stage run in it (a pooled Ray
    worker, or one process running stage after stage) starts with the memory free. Returns how many are
    reachable all the same: ZeRO-3's parameter hooks keep its model alive inside DeepSpeed, so a process
    that ran a ZeRO-3 stage should not run another."""
    left = [weakref.ref(engine) for engine in _ENGINES]
    _ENGINES.clear()
    for ref in left:
        engine = ref()
        if engine is not None:  # one already collected needs no destroying
            engine.destroy()
        del engine  # no local name may keep it past the collection below
    gc.collect()
    return sum(ref() is not None for ref in left)


def import_muon_uncompiled() -> None:
    """Import DeepSpeed's Muon optimizer without wrapping its kernels in torch.compile.

    Every ZeRO engine imports Muon (to check the optimizer's type), and Muon's module compiles its
    kernels at import, which lengthens every training process's start. Our engines always use AdamW, so
    those kernels never run."""
    from deepspeed.runtime import compiler

    if "deepspeed.runtime.zero.muon.original_muon" in sys.modules:
        return
    compile_decorator = compiler.compile
    compiler.compile = lambda: (lambda fn: fn)
    try:
        import deepspeed.runtime.zero.muon.muon_optimizer
        import deepspeed.runtime.zero.muon.original_muon  # noqa: F401
    finally:
        compiler.compile = compile_decorator


def rng_state() -> dict[str, Any]:
    """Every generator training draws from: Python's, numpy's, torch's CPU one and, on a GPU, torch's of this rank's
    device (dropout there draws from it)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():  # a CPU run's checkpoint resumed on a GPU: seeded as it was
        torch.cuda.set_rng_state(state["cuda"])


def save_resumable(engine: Engine, ckpt_dir: Path, step: int, extra: dict[str, Any] | None = None, keep: int | None = 1) -> None:
    """Model, optimizer, scheduler and our own counters; DeepSpeed writes `latest` last, so a kill mid-save
    leaves the previous checkpoint as the one that loads. The newest `keep` tags stay (`prune_old_tags`);
    None keeps the older ones too (for a model whose checkpoint must stay in step with another one's until
    that one is saved too)."""
    client_state = {"step": step, "rng": rng_state(), **(extra or {})}
    engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}", client_state=client_state)
    if keep is not None:
        prune_old_tags(ckpt_dir, step, keep)


TAG = re.compile(r"^step(\d+)$")


def stale_tags(names: list[str], step: int, keep: int) -> list[str]:
    """Of a checkpoint folder's entries, the tags to delete once tag `step` is saved: all but the newest `keep`
    up to `step`, and any after it (a killed run's, from steps this run does again)."""
    steps = sorted((int(m.group(1)), name) for name in names if (m := TAG.match(name)))
    upto = [name for n, name in steps if n <= step]
    return upto[: max(len(upto) - keep, 0)] + [name for n, name in steps if n > step]


def prune_old_tags(ckpt_dir: Path, step: int, keep: int) -> None:
    """Rank 0: `stale_tags` of `ckpt_dir` deleted."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    import shutil

    names = [child.name for child in ckpt_dir.iterdir() if child.is_dir()]
    for name in stale_tags(names, step, keep):
        shutil.rmtree(ckpt_dir / name, ignore_errors=True)


def load_resumable(engine: Engine, ckpt_dir: Path, tag: str | None = None) -> dict[str, Any] | None:
    """The client state of the newest complete checkpoint (or of `tag`), restoring engine and RNG;
    None when there is none."""
    if not (ckpt_dir / RESUME_TAG).is_file():
        return None
    path, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    if path is None:
        return None
    set_rng_state(client_state["rng"])
    return client_state


def full_state_dict(engine: Engine) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on rank 0 (gathering ZeRO-3 partitions); None on other ranks."""
    module = engine.module
    if engine.zero_optimization_stage() == 3:
        import deepspeed

        state = {}
        for name, param in module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                if engine.global_rank == 0:
                    state[name] = param.detach().cpu().clone()
        persistent = set(module.state_dict())
        for name, buf in module.named_buffers():
            if name in persistent:
                state[name] = buf.detach().cpu().clone()
        return state if engine.global_rank == 0 else None
    if engine.global_rank != 0:
        return None
    # a CPU copy per tensor: under ZeRO-1/2 the weights are views of one flat buffer, and pickling a
    # view (to send it through Ray) pickles its whole buffer, once per tensor
    return {name: t.detach().to("cpu", copy=True) for name, t in module.state_dict().items()}
