"""The flow's own local Ray cluster (`flows.ray_cluster.RaySession`, as `rlhf run` starts it)."""

from __future__ import annotations

import os

import ray

from configs.schema import InfraConfig
from flows.ray_cluster import RaySession


@ray.remote(num_cpus=1)
def niceness() -> int:
    return os.nice(0)


def test_a_local_cluster_runs_its_workers_at_the_drivers_priority():
    """Ray's default starts workers at nice 15, where every nice-0 process on the machine preempts
    their compute; the stage workers are the job on the flow's own cluster."""
    session = RaySession(InfraConfig(num_cpus=2))
    session.ensure()
    try:
        assert session.where == "local cluster"
        assert ray.get(niceness.remote()) == os.nice(0) == 0
    finally:
        session.shutdown()
    assert not ray.is_initialized()
