"""The flow's own local Ray cluster (`flows.services.ray_cluster.RaySession`, as `rlhf run` starts it)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import ray

from configs import load_config
from configs.schema import InfraConfig
from flows.services.ray_cluster import RaySession, drop_early, session_for, start_early
from runtime.worker_pool import run_stage, stage_shape
from stages.dag import declaration as dag
from stages.dag.contract import StageContext, StageResult

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


def sleep_a_minute(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    """A stage that holds its worker (and the cluster's CPUs) until it is stopped."""
    time.sleep(60)
    return StageResult({}, {})


def test_a_stop_ends_the_stage_threads_and_leaves_this_process_and_its_next_cluster_working(tmp_path):
    """Ctrl-C mid-stage: `stop` shuts Ray down while one stage thread waits on its worker and another
    waits for the CPUs that worker holds. Both end with an error within seconds; neither thread's cleanup
    (killing its workers, removing their placement) calls into Ray mid-shutdown, which would end this
    whole process. The next session in this process starts a cluster and runs a stage as before."""
    cfg = load_config(None, ["infra.num_cpus=2"])
    ctx = StageContext(stage="probe", config=cfg, output_dir=tmp_path / "out", work_dir=tmp_path / "work")
    session = RaySession(cfg.infra)
    session.ensure()
    try:
        stop_mid_stage(session, ctx, cfg)
    finally:
        session.shutdown()  # (already down when the test passes)

    again = RaySession(cfg.infra)
    again.ensure()
    try:
        done = run_stage(f"{__name__}:quick", ctx, {}, cfg.infra, distributed=False, pool=again.pool)
        assert done.metrics == {"ok": 1.0}
    finally:
        again.shutdown()


def stop_mid_stage(session: RaySession, ctx: StageContext, cfg) -> None:
    ended: dict[str, BaseException] = {}

    def stage(name: str) -> None:
        try:
            run_stage(f"{__name__}:sleep_a_minute", ctx, {}, cfg.infra, distributed=False, pool=session.pool)
        except BaseException as exc:  # noqa: BLE001 - what the stage thread ended with is the point
            ended[name] = exc

    running = threading.Thread(target=stage, args=("running",))
    running.start()
    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # the running stage holds both CPUs
    waiting = threading.Thread(target=stage, args=("waiting",))
    waiting.start()
    time.sleep(1.5)  # in the pool's wait for the CPUs (wherever it is, its next call into Ray is gated)
    stopped = time.monotonic()
    session.stop()
    for t in (running, waiting):
        t.join(timeout=max(0.0, stopped + 40 - time.monotonic()))
    # a stop ends both within seconds; the bound is generous for a loaded machine, and short of the minute the
    # running stage would sleep if nothing stopped it
    assert not running.is_alive() and not waiting.is_alive(), "a stage thread still ran 40 s after session.stop()"
    assert isinstance(ended["waiting"], KeyboardInterrupt), ended
    # the running stage's pending ray.get ended with the cluster: Ray raises its error there, or SystemExit
    # when its core worker is already gone (in this thread only: the process goes on)
    assert isinstance(ended["running"], ray.exceptions.RayError | SystemExit), ended
    assert not ray.is_initialized()


def quick(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    return StageResult({}, {"ok": 1.0})
