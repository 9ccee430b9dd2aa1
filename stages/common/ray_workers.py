"""Run a stage as Ray work: one worker, or `infra.num_workers` DeepSpeed ranks placed with a
placement group. Rank 0's result is the stage's result."""

from __future__ import annotations

import dataclasses
import importlib
import os
import socket
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from configs.errors import PipelineError
from configs.schema import InfraConfig
from stages.contract import StageContext, StageResult, run_timed


def prepare_process(num_threads: int) -> None:
    """In a fresh Ray worker process: name the accelerator, use the cores this actor holds, quiet HF bars."""
    import torch
    import transformers

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # say it, rather than have DeepSpeed warn it guessed
    torch.set_num_threads(num_threads)
    transformers.utils.logging.disable_progress_bar()


def free_address() -> tuple[str, int]:
    """This node's IP and a free port: rank 0's rendezvous point for torch.distributed."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def join_env(master: tuple[str, int], rank: int, world_size: int) -> None:
    """The environment torch.distributed (and DeepSpeed) read to join the group."""
    os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK="0")


def leave_process_group() -> None:
    """A worker exiting with a process group open crashes Ray's task receiver."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@ray.remote
class StageWorker:
    """One rank of a stage. Sets the torch.distributed environment and the thread count Ray's
    `num_cpus` implies (Ray pins OMP threads to it), then calls the stage function."""

    def __init__(self, rank: int, world_size: int, num_threads: int):
        self.rank, self.world_size = rank, world_size
        prepare_process(num_threads)

    def rendezvous(self) -> tuple[str, int]:
        return free_address()

    def run(self, entrypoint: str, ctx: StageContext, inputs: dict[str, Path], master: tuple[str, int], cwd: str):
        os.chdir(cwd)  # relative paths in the config mean what they meant to the driver
        join_env(master, self.rank, self.world_size)
        module, func = entrypoint.split(":")
        stage_fn = getattr(importlib.import_module(module), func)
        try:
            return run_timed(stage_fn, dataclasses.replace(ctx, rank=self.rank, world_size=self.world_size), inputs)
        finally:
            leave_process_group()


def check_resources(stage: str, n_workers: int, cpus: int, gpus: float) -> None:
    have = ray.cluster_resources()
    need_cpu, need_gpu = n_workers * cpus, n_workers * gpus
    if need_cpu > have.get("CPU", 0) or need_gpu > have.get("GPU", 0):
        raise PipelineError(
            f"stage {stage} needs {n_workers} worker(s) x {cpus} CPU / {gpus} GPU, but the Ray cluster has "
            f"{have.get('CPU', 0):g} CPU / {have.get('GPU', 0):g} GPU (see infra.num_workers, infra.cpus_per_worker, infra.gpus_per_worker)"
        )


def run_stage(entrypoint: str, ctx: StageContext, inputs: dict[str, Path], infra: InfraConfig, distributed: bool) -> StageResult:
    n = infra.num_workers if distributed else 1
    cpus, gpus = infra.cpus_per_worker, infra.gpus_per_worker
    check_resources(ctx.stage, n, cpus, gpus)
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    pg = placement_group([bundle] * n, strategy="PACK")
    ray.get(pg.ready())
    workers = [
        StageWorker.options(
            num_cpus=cpus,
            num_gpus=gpus,
            name=None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
        ).remote(i, n, cpus)
        for i in range(n)
    ]
    try:
        master = ray.get(workers[0].rendezvous.remote())
        results = ray.get([w.run.remote(entrypoint, ctx, inputs, master, os.getcwd()) for w in workers])
        return results[0]
    finally:
        for w in workers:
            ray.kill(w)
        remove_placement_group(pg)
