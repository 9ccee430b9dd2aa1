"""The Ray cluster stage work runs on, as the stages' harness and the RL stage's actors both see it: a local
cluster of the run's own, what its nodes have (CPUs, GPUs, custom resources), bundles and actor classes."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable

import ray

from runtime import ray_shutdown
from runtime.worker_setup import job_runtime_env


def start_local_cluster(num_cpus: int | None, log_to_driver: bool = True, num_gpus: int | None = None,
                        env_vars: dict[str, str] | None = None) -> None:
    """A fresh local Ray cluster (even when `ray start` left one running on this machine) whose workers
    run at nice 0 and die with the driver's process group.

    Ray starts workers at nice 15 so that its daemons stay responsive; here the workers are the job, and
    at nice 15 every nice-0 process (the flow's driver, a Prefect server, Ray's own daemons, anything
    else on the machine) preempts their compute, which slows a stage many times over on a busy machine
    (docs/benchmarks.md).

    Ray also starts each worker in a process group of its own (to kill what a worker spawns when it
    exits); a SIGKILL of the driver's group then kills the GCS and raylet, children of the driver, but not
    the workers, which live on until they notice the raylet is gone, if ever. Kept in the driver's group,
    they die with it.

    Every worker starts with `runtime.worker_setup`'s hook (imports no stage uses left out).

    Nothing reads Ray's task events here (no dashboard): they are off, and with them the driver's wait, at
    Ray's shutdown, to flush them to a GCS that a stop's signal to the group has already ended (5 s).

    `num_gpus`: the GPUs Ray schedules (None: those it detects); declared on a machine without CUDA they are
    logical, which walks a GPU layout's scheduling up to where torch would need one. `env_vars`: every worker's
    environment from its start (`job_runtime_env`)."""
    ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=log_to_driver,
             runtime_env=job_runtime_env(env_vars),
             _system_config={"worker_niceness": 0, "process_group_cleanup_enabled": False,
                             "task_events_report_interval_ms": 0})
    ray_shutdown.reopen()


@contextlib.contextmanager
def local_cluster(num_cpus: int | None, log_to_driver: bool = True, num_gpus: int | None = None):
    """`start_local_cluster` for the span of a `with` block, shut down when it ends."""
    start_local_cluster(num_cpus, log_to_driver, num_gpus)
    try:
        yield
    finally:
        ray.shutdown()


def thread_env(num_threads: int) -> dict:
    """Ray actor options whose process starts with `num_threads` OpenMP threads: for actors whose
    `num_cpus` is a share of cores they use in turns with others (Ray would set OMP_NUM_THREADS to 1)."""
    return {"runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(num_threads)}}}


@functools.cache
def actor_class(cls: type):
    """A plain worker class as a Ray actor class, made once per class (the RL stage's workers are plain
    classes, so that one process can run them without Ray)."""
    return ray.remote(cls)


def bundle(cpus: float, gpus: float, resources: dict[str, float]) -> dict[str, float]:
    """One worker's share of a placement group: its CPUs, GPUs and the custom resources that pin it to
    the nodes started with them (`infra.worker_resources`)."""
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **resources}


def node_capacity(nodes: list[dict], resources: dict[str, float]) -> tuple[float, float]:
    """(CPUs, GPUs) of the live nodes in `nodes` (as `ray.nodes()` lists them) that have `resources`."""
    usable = [n["Resources"] for n in nodes
              if n["Alive"] and all(n["Resources"].get(k, 0) >= v for k, v in resources.items())]
    return sum(r.get("CPU", 0) for r in usable), sum(r.get("GPU", 0) for r in usable)


def capacity(resources: dict[str, float]) -> tuple[float, float]:
    """(CPUs, GPUs) stage work may use: the whole cluster's, or its nodes' with `infra.worker_resources`."""
    return node_capacity(ray_shutdown.call(ray.nodes), resources)


def cluster_name(resources: dict[str, float]) -> str:
    """The part of the cluster stage work may use, as error messages name it."""
    if not resources:
        return "the Ray cluster"
    pairs = ", ".join(f"{k}: {v:g}" for k, v in resources.items())
    return f"the part of the Ray cluster with {{{pairs}}} (infra.worker_resources)"


NODE_POLL_S = 1.0  # how often a stage waiting for nodes (`infra.node_wait_s`) looks at the cluster again
def capacity_within(resources: dict[str, float], enough: Callable[[float, float], bool], wait_s: float) -> tuple[float, float]:
    """`capacity`, once it is `enough` or `wait_s` has passed (nodes joining meanwhile, e.g. a lost one back)."""
    deadline, said = time.monotonic() + wait_s, False
    while True:
        have = capacity(resources)
        if enough(*have) or time.monotonic() >= deadline:
            return have
        if not said:
            print(f"[ray] waiting up to {wait_s:g} s (infra.node_wait_s) for {cluster_name(resources)} to have the "
                  f"resources; it has {have[0]:g} CPU / {have[1]:g} GPU", flush=True)
            said = True
        time.sleep(NODE_POLL_S)
