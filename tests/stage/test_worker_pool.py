"""Stage workers kept between the stages of a flow run (`worker_pool.WorkerPool`) on a real local Ray
cluster: the next stage of the same shape runs in the same process, with a fresh torch.distributed
group and a DeepSpeed engine that trains as in a fresh process; a failed stage's workers are not
reused; an idle worker holds no CPUs while outside work (the RL stage's actors) needs them, and runs
the stage after it; a stage waiting for the CPUs a running stage holds takes its workers when it is done,
and one of another shape gets the CPUs an idle set held."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group

from configs.schema import InfraConfig, TrainingConfig
from runtime.worker_pool import WorkerPool, run_stage
from stages.common import deepspeed_engine
from stages.dag.contract import StageContext, StageResult

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

INFRA = InfraConfig(num_workers=1, cpus_per_worker=2)
HERE = "tests.stage.test_worker_pool"


def train_one_step(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    """A stage: one DeepSpeed step of a small linear model; its loss and the process it ran in."""
    deepspeed_engine.init_distributed()
    torch.manual_seed(0)
    train = TrainingConfig(lr=1e-2, micro_batch_size=4, warmup_ratio=0.0, min_lr_ratio=1.0)
    engine = deepspeed_engine.initialize(torch.nn.Linear(8, 1), deepspeed_engine.engine_config(ctx.config.infra, train, 1))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()
    after = engine(x).pow(2).mean().item()
    return StageResult({}, {"pid": os.getpid(), "loss": loss.item(), "after": after,
                            "world": torch.distributed.get_world_size()})


def fail(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    raise ValueError("this stage fails")


def hold(ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
    """A stage that runs for a while: the other one must wait for its CPUs."""
    time.sleep(3)
    return StageResult({}, {"pid": os.getpid()})


@pytest.fixture
def ctx(tmp_path, fast_config):
    cfg = fast_config.model_copy(update={"infra": INFRA})
    return StageContext(stage="probe", config=cfg, output_dir=tmp_path / "out", work_dir=tmp_path / "work")


def free_cpus() -> float:
    """The cluster's free CPUs once a freed placement group is back (Ray frees them asynchronously)."""
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return ray.available_resources().get("CPU", 0)


def run(pool, ctx, func: str) -> dict:
    return run_stage(f"{HERE}:{func}", ctx, {}, INFRA, distributed=True, pool=pool).metrics


def wait_until(done, what: str, within_s: float = 120.0) -> None:
    """Poll `done()` until it holds; a regression fails here, naming what never happened, instead of hanging."""
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, f"not within {within_s:g} s: {what}"
        time.sleep(0.05)


def test_the_next_stage_runs_in_the_same_worker_with_a_fresh_process_group_unless_one_failed(ray_cluster, ctx):
    pool = WorkerPool()
    first, second = run(pool, ctx, "train_one_step"), run(pool, ctx, "train_one_step")
    assert first["pid"] == second["pid"]
    assert second == first  # the same loss before and after the step: nothing of the first engine is left
    assert first["after"] < first["loss"] and first["world"] == 1
    with pytest.raises(ValueError, match="this stage fails"):
        run(pool, ctx, "fail")  # in the same worker, which is then killed
    after = run(pool, ctx, "train_one_step")
    assert after["pid"] != first["pid"] and after["loss"] == first["loss"]
    pool.clear()
    assert free_cpus() == 2


def test_an_idle_worker_holds_no_cpus_while_outside_work_needs_them_and_serves_the_stage_after(ray_cluster, ctx):
    pool = WorkerPool()
    first = run(pool, ctx, "train_one_step")
    assert ray.available_resources().get("CPU", 0) == 0  # the idle worker's reservation holds them
    with pool.outside_work():
        assert free_cpus() == 2  # given back: the outside work's actors can have them
        beside = run(pool, ctx, "train_one_step")  # a stage beside it reserves them again for its run
        assert free_cpus() == 2
    after = run(pool, ctx, "train_one_step")
    assert first["pid"] == beside["pid"] == after["pid"]  # one process throughout, no fresh imports
    assert after["loss"] == first["loss"] and ray.available_resources().get("CPU", 0) == 0
    pool.clear()
    assert free_cpus() == 2


def test_a_stage_waiting_for_the_cpus_takes_the_running_stages_workers(ray_cluster, ctx):
    pool = WorkerPool()
    results = {}
    first = threading.Thread(target=lambda: results.update(first=run(pool, ctx, "hold")))
    first.start()
    wait_until(lambda: ray.available_resources().get("CPU", 0) == 0, "the first stage holds both CPUs")
    results["second"] = run(pool, ctx, "hold")
    first.join()
    assert results["second"]["pid"] == results["first"]["pid"]
    pool.clear()


def test_a_stage_waiting_for_its_reservation_gets_the_cpus_a_set_of_another_shape_leaves_idle(ray_cluster, ctx):
    """Two shapes on 2 CPUs: a 2-CPU stage starts reserving while outside work holds 1 CPU; a 1-CPU stage
    runs beside it on the other, and the outside work ends before it does. The 1-CPU set going idle must
    not keep its CPU: the waiting stage would wait for it for ever."""
    pool, one_cpu = WorkerPool(), InfraConfig(num_workers=1, cpus_per_worker=1)
    results = {}
    outside = placement_group([{"CPU": 1}])  # stands in for the RL stage's actors
    ray.get(outside.ready())
    with pool.outside_work():
        wide = threading.Thread(target=lambda: results.update(wide=run(pool, ctx, "train_one_step")), daemon=True)
        wide.start()
        time.sleep(1.0)  # its reservation waits for the outside work's CPU
        narrow = threading.Thread(daemon=True, target=lambda: results.update(
            narrow=run_stage(f"{HERE}:hold", ctx, {}, one_cpu, distributed=True, pool=pool).metrics))
        narrow.start()
        wait_until(lambda: ray.available_resources().get("CPU", 0) == 0, "the 1-CPU stage holds the other CPU")
    remove_placement_group(outside)  # the outside work ends while the 1-CPU stage still runs
    narrow.join(timeout=60)
    wide.join(timeout=60)
    try:
        assert not wide.is_alive(), "the 2-CPU stage still waits for the CPU the idle 1-CPU set holds"
        assert results["wide"]["after"] < results["wide"]["loss"] and "pid" in results["narrow"]
    finally:
        pool.clear()
        wide.join(timeout=30)
    assert free_cpus() == 2
