"""Run a stage as Ray work: one worker, or `infra.num_workers` DeepSpeed ranks placed with a
placement group, kept for the flow's next stage of the same shape. Rank 0's result is the stage's result."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import gc
import importlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from configs.errors import PipelineError
from configs.schema import InfraConfig
from runtime import ray_shutdown
from runtime.resources import bundle, capacity_within, cluster_name, thread_env
from stages.common.dist_env import free_address, join_env, leave_process_group, prepare_process
from stages.dag.contract import StageContext, StageResult, run_timed


def free_memory() -> None:
    """Drop what the finished stage left (its engine, models, cached GPU blocks), and hand the heap it freed
    back to the system: Arrow's allocator and glibc's keep freed pages for reuse, and the next stage this
    process runs would start with them (data prep's parsing of a million rows)."""
    import pyarrow
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    pyarrow.default_memory_pool().release_unused()
    libc = ctypes.util.find_library("c")
    if libc is not None:
        with contextlib.suppress(AttributeError):  # malloc_trim is glibc's
            ctypes.CDLL(libc).malloc_trim(0)


@ray.remote
class StageWorker:
    """One rank of a stage. Sets the torch.distributed environment and the thread count Ray's
    `num_cpus` implies (Ray pins OMP threads to it), then calls the stage function."""

    def __init__(self, rank: int, world_size: int, num_threads: int):
        self.rank, self.world_size = rank, world_size
        self.spent = False  # a stage left memory behind that this process cannot free
        prepare_process(num_threads)

    def rendezvous(self) -> tuple[str, int]:
        return free_address()

    def run(self, entrypoint: str, ctx: StageContext, inputs: dict[str, Path], master: tuple[str, int] | None, cwd: str,
            files=None):
        """`files` (`artifacts.node_files.RunFiles`): no disk is shared with the driver; the inputs come from
        the tracking server, work and outputs stay on this node, and rank 0 uploads the outputs."""
        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative paths in the config mean what they meant to the driver
        if master is not None:
            join_env(master, self.rank, self.world_size)
        module, func = entrypoint.split(":")
        stage_fn = getattr(importlib.import_module(module), func)
        ctx = dataclasses.replace(ctx, rank=self.rank, world_size=self.world_size)
        try:
            if files is None:
                return run_timed(stage_fn, ctx, inputs)
            fetch = functools.partial(whole_models, files.fetch_inputs) if files.merge_adapters else files.fetch_inputs
            inputs = fetch()
            rank = self.rank if master is not None else None  # a driver stage uploads its actors' checkpoints whole
            ctx = dataclasses.replace(ctx, work_dir=files.work_dir(), output_dir=files.output_dir(),
                                      on_checkpoint=functools.partial(files.checkpoint_saved, rank=rank),
                                      fetch_inputs=fetch)
            result = run_timed(stage_fn, ctx, inputs)
            if self.rank == 0:
                files.upload_outputs(result.outputs)
            files.finished()
            return result
        finally:
            from stages.common.deepspeed_engine import release_engines  # torch: only in the worker

            self.spent = release_engines() > 0
            leave_process_group()
            free_memory()  # this process may run the next stage

    def reusable(self) -> bool:
        return not self.spent


def whole_models(fetch: Callable[..., dict[str, Path]], names: list[str] | None = None) -> dict[str, Path]:
    """`fetch(names)`'s inputs, a LoRA adapter among them merged into its base on this node (for a stage that
    takes whole models, `StageSpec.takes_adapters` false)."""
    from stages.common.checkpoint_paths import is_adapter
    from stages.lora_merge import stage as lora_merge

    paths = fetch(names)
    if any(is_adapter(p) for p in paths.values()):
        paths = {name: lora_merge.materialize(p) for name, p in paths.items()}
    return paths


def stage_actor() -> Any:
    """StageWorker as the Ray actor class its decorator made it (Ray's stubs type actor handles loosely)."""
    return cast(Any, StageWorker)


Shape = tuple[int, int, float, tuple[tuple[str, float], ...]]  # workers, CPUs each, GPUs each, custom resources each


PLACEMENT_POLL_S = 5.0  # how often a pending reservation checks that the cluster still has its resources


def check_resources(stage: str, shape: Shape, wait_s: float = 0.0) -> None:
    n_workers, cpus, gpus, resources = shape
    enough = lambda cpu, gpu: n_workers * cpus <= cpu and n_workers * gpus <= gpu  # noqa: E731
    have_cpu, have_gpu = capacity_within(dict(resources), enough, wait_s)
    if not enough(have_cpu, have_gpu):
        raise PipelineError(
            f"stage {stage} needs {n_workers} worker(s) x {cpus} CPU / {gpus} GPU, but {cluster_name(dict(resources))} has "
            f"{have_cpu:g} CPU / {have_gpu:g} GPU (see infra.num_workers, infra.cpus_per_worker, infra.gpus_per_worker)"
        )


@dataclasses.dataclass
class WorkerSet:
    """A stage's ranks and the placement group that reserves their resources (None while the set gives
    it back). `bound`: the ranks run inside the placement group with its resources as their own (they
    go with it: GPU ranks get their devices from it). Unbound ranks, on a pool's single-node cluster,
    of a shape that asks for no GPUs, hold no resources themselves (their threads are set at start), so
    an idle set may give its reservation back to other work and keep its processes."""

    shape: Shape
    workers: list
    pg: object | None
    bound: bool = True

    @classmethod
    def start(cls, shape: Shape, stage: str = "", wait_s: float = 0.0, bound: bool = True) -> WorkerSet:
        """Reserve the shape's bundles and start its workers (see `reserve`)."""
        n, cpus, gpus, _ = shape
        bound = bound or gpus > 0
        pg = reserve(shape, stage, wait_s)
        try:
            def options(i: int) -> dict:
                if not bound:
                    return {"num_cpus": 0, **thread_env(max(1, int(cpus)))}
                return {"num_cpus": cpus, "num_gpus": gpus,
                        "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)}

            workers = ray_shutdown.call(lambda: [stage_actor().options(**options(i)).remote(i, n, cpus) for i in range(n)])
        except BaseException:
            ray_shutdown.cleanup(lambda: remove_placement_group(pg))
            raise
        return cls(shape, workers, pg, bound)

    def reserve(self, stage: str = "", wait_s: float = 0.0) -> None:
        if self.pg is None:
            self.pg = reserve(self.shape, stage, wait_s)

    def unreserve(self) -> None:
        pg, self.pg = self.pg, None
        if pg is not None:
            ray_shutdown.cleanup(lambda: remove_placement_group(pg))

    def kill(self) -> None:
        ray_shutdown.cleanup(self._kill)

    def _kill(self) -> None:
        for w in self.workers:
            ray.kill(w)
        if self.pg is not None:
            remove_placement_group(self.pg)


def reserve(shape: Shape, stage: str = "", wait_s: float = 0.0):
    """A placement group with the shape's bundles, once ready. It waits while other work holds the
    resources; when the cluster no longer has them at all (its nodes lost), it waits `wait_s` for nodes
    to join, then fails with `check_resources`' line."""
    n, cpus, gpus, resources = shape
    pg = ray_shutdown.call(lambda: placement_group([bundle(cpus, gpus, dict(resources))] * n, strategy="PACK"))
    try:
        ready = ray_shutdown.call(pg.ready)
        while not ray.wait([ready], timeout=PLACEMENT_POLL_S)[0]:
            check_resources(stage, shape, wait_s)
    except BaseException:
        ray_shutdown.cleanup(lambda: remove_placement_group(pg))
        raise
    return pg


class WorkerPool:
    """Stage workers kept alive between the stages of one flow run, on a cluster the run owns: the
    next stage of the same shape runs in the same processes instead of starting fresh ones (each fresh
    one spends seconds importing torch, transformers and DeepSpeed). A stage that waits for the CPUs
    another stage's workers hold takes those workers when that stage is done.

    An idle set keeps its reservation for the next stage, and is killed when a stage of another shape
    needs the resources, after a stage failed in it, and at the end. While work outside the pool runs
    (the RL stage's own actors), or a stage waits for its own reservation, an idle set gives its
    reservation back: its CPU-only ranks live on, holding nothing, for a later stage; ranks with GPUs go
    (`WorkerSet.bound`). So no idle set holds what a waiting stage or the outside work waits for."""

    WAIT_S = 1.0  # how often a waiting stage looks again at what the cluster has free

    def __init__(self, keep_idle: bool = True):
        # keep_idle: the pool of a run's own local cluster (one node), whose CPU-only sets start unbound;
        # without it every set goes when its stage ends
        self.keep_idle = keep_idle
        self._cond = threading.Condition()
        self._idle: list[WorkerSet] = []
        self._busy = 0  # sets out with a running stage
        self._outside = 0  # running work that needs the cluster's resources outside the pool
        self._reserving = 0  # stages waiting for their set's reservation

    def acquire(self, shape: Shape, stage: str = "", wait_s: float = 0.0) -> WorkerSet:
        """Workers of `shape` for `stage`: an idle set of that shape, else a new one once the cluster has
        room (`wait_s`: see `WorkerSet.start`)."""
        with self._cond:
            while True:
                reusable = next((s for s in self._idle if s.shape == shape), None)
                if reusable is not None or self._busy == 0 or self._idle or free_for(shape):
                    break
                self._cond.wait(self.WAIT_S)  # a running stage's set may come back (or its resources free)
            if reusable is not None:
                self._idle.remove(reusable)
                doomed = self._idle_hold_nothing()
            else:
                doomed, self._idle = self._idle, []
            self._busy += 1
            self._reserving += 1
        try:
            for s in doomed:
                s.kill()
            if reusable is not None:
                reusable.reserve(stage, wait_s)  # waits while other work holds the resources
                return reusable
            return WorkerSet.start(shape, stage, wait_s, bound=not self.keep_idle)
        except BaseException:
            if reusable is not None:
                reusable.kill()
            self.release(None, healthy=False)
            raise
        finally:
            with self._cond:
                self._reserving -= 1

    def prestart(self, shape: Shape) -> None:
        """Start a set of `shape` now, idle, for the first stage that asks for it (its processes import
        their libraries meanwhile). Nothing is started when the cluster lacks the resources."""
        if free_for(shape):
            started = WorkerSet.start(shape, bound=not self.keep_idle)
            with self._cond:
                self._idle.append(started)
                self._cond.notify_all()

    def release(self, workers: WorkerSet | None, healthy: bool) -> None:
        with self._cond:
            self._busy -= 1
            needed = self._outside or self._reserving  # the resources, by other work or a waiting stage
            keep = workers is not None and healthy and self.keep_idle and (not needed or not workers.bound)
            if keep and workers is not None:
                if needed:
                    workers.unreserve()
                self._idle.append(workers)
            self._cond.notify_all()
        if workers is not None and not keep:
            workers.kill()

    def _idle_hold_nothing(self) -> list[WorkerSet]:
        """Under the lock: the idle sets give their reservations back; returns the bound ones, to be killed."""
        doomed = [s for s in self._idle if s.bound]
        self._idle = [s for s in self._idle if not s.bound]
        for s in self._idle:
            s.unreserve()
        return doomed

    @contextlib.contextmanager
    def outside_work(self):
        """While the block runs, nothing idles on the cluster's resources (the block's actors need them)."""
        with self._cond:
            self._outside += 1  # from here on, a released set gives its reservation back
            doomed = self._idle_hold_nothing()
        for s in doomed:
            s.kill()
        try:
            yield
        finally:
            with self._cond:
                self._outside -= 1
                self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            doomed, self._idle = self._idle, []
        for s in doomed:
            s.kill()


def free_for(shape: Shape) -> bool:
    n, cpus, gpus, resources = shape
    free = ray_shutdown.call(ray.available_resources)  # a stage waiting for CPUs stops here on a stop
    return all(free.get(k, 0) >= n * v for k, v in [("CPU", cpus), ("GPU", gpus), *resources])


def stage_shape(infra: InfraConfig, distributed: bool) -> Shape:
    return (infra.num_workers if distributed else 1, infra.cpus_per_worker, infra.gpus_per_worker,
            tuple(sorted(infra.worker_resources.items())))


def run_stage(entrypoint: str, ctx: StageContext, inputs: dict[str, Path], infra: InfraConfig, distributed: bool,
              pool: WorkerPool | None = None, files=None) -> StageResult:
    """Run the stage function on its ranks, in workers from `pool` (fresh ones without a pool); `files`:
    see `StageWorker.run`."""
    shape = stage_shape(infra, distributed)
    check_resources(ctx.stage, shape, infra.node_wait_s)
    pool = pool or WorkerPool(keep_idle=False)
    ranks = pool.acquire(shape, ctx.stage, infra.node_wait_s)
    healthy = False
    try:
        master = ray.get(ray_shutdown.call(ranks.workers[0].rendezvous.remote))
        results = ray.get(ray_shutdown.call(lambda: [w.run.remote(entrypoint, ctx, inputs, master, os.getcwd(), files)
                                                     for w in ranks.workers]))
        # a worker still holding a stage's model (ZeRO-3) is replaced, not kept for the next stage
        healthy = all(ray.get(ray_shutdown.call(lambda: [w.reusable.remote() for w in ranks.workers])))
        return results[0]
    finally:
        pool.release(ranks, healthy)


DRIVER_SHARE = 0.01  # of one unit of each `infra.worker_resources` resource: enough to place it, none used up


def run_driver_stage(entrypoint: str, ctx: StageContext, infra: InfraConfig, files) -> StageResult:
    """A stage that starts actors of its own (RL), run in a process on a stage node rather than in the
    driver's, so that it reads and writes no file of the driver's (`files`). It takes no CPU from its
    actors; stopping the flow (Ray shut down in the driver) ends it and its actors with it."""
    resources = {k: DRIVER_SHARE for k in infra.worker_resources}
    driver = ray_shutdown.call(lambda: stage_actor().options(num_cpus=0, resources=resources).remote(0, 1, 1))
    try:
        return ray.get(ray_shutdown.call(lambda: driver.run.remote(entrypoint, ctx, {}, None, os.getcwd(), files)))
    finally:
        ray_shutdown.cleanup(lambda: ray.kill(driver))

