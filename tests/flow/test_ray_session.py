"""The flow's own local Ray cluster (`flows.ray_cluster.RaySession`, as `rlhf run` starts it)."""

from __future__ import annotations

import os

import pytest
import ray

from configs import load_config
from configs.schema import InfraConfig
from flows.ray_cluster import RaySession, drop_early, session_for, start_early
from stages import dag
from stages.common.ray_workers import stage_shape

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)


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


def test_an_early_start_hands_the_flow_a_cluster_with_the_first_stages_worker_waiting():
    """`rlhf run` on a new store starts the cluster and data prep's worker while Prefect starts; the
    flow's session is that one (taken over once), and the first stage runs in the waiting worker."""
    cfg = load_config(None, [])
    start_early(cfg)
    session = session_for(cfg.infra)
    try:
        assert session.where == "local cluster"
        assert session_for(cfg.infra) is not session
        [waiting] = session.pool._idle
        shape = stage_shape(cfg.infra, dag.STAGES[0].distributed)
        assert waiting.shape == shape
        assert session.pool.acquire(shape) is waiting
        session.pool.release(waiting, healthy=True)
    finally:
        session.shutdown()
    assert not ray.is_initialized()


def test_an_early_start_for_another_config_is_shut_down_not_handed_over():
    start_early(load_config(None, []))
    session = session_for(InfraConfig(num_cpus=1))
    assert session.where is None and not ray.is_initialized()


def test_an_early_start_no_flow_took_over_is_shut_down():
    start_early(load_config(None, []))
    assert ray.is_initialized()
    drop_early()
    assert not ray.is_initialized()
