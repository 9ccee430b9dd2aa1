"""RL's actor groups queue for a cluster another stage holds (as DPO did while RL waited), instead of
failing on a timer; a stop request ends the wait and frees what was reserved."""

import itertools

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from configs import PipelineError, load_config
from runtime.rl_placement import Placement

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)


@pytest.fixture
def held_cluster(ray_cluster):
    """Another stage's workers holding both CPUs of the module's 2-CPU cluster."""
    holder = placement_group([{"CPU": 2}])
    ray.get(holder.ready(), timeout=60)
    yield holder
    remove_placement_group(holder)


def test_rl_waits_for_the_cpus_another_stage_holds_and_starts_when_they_free(held_cluster):
    """The wait looks at the stop request once a round (a round waits up to a second for the reservation): the
    third look frees the holder's CPUs, and the reservation comes after that, not before."""
    looks: list[str] = []

    def stop() -> bool:
        looks.append("look")
        if len(looks) == 3:
            remove_placement_group(held_cluster)
            looks.append("freed")
        return False

    cfg = load_config(None)  # hybrid, every group colocated: one bundle of 2 CPUs
    placement = Placement(cfg, needs_critic=False, stop=stop)
    try:
        assert looks[:4] == ["look", "look", "look", "freed"]  # it waited two rounds while the CPUs were held
        assert set(placement.slots) == {"actor", "reward"}
    finally:
        placement.release()


def test_a_stop_request_ends_the_wait_and_frees_the_reservation(held_cluster):
    looks = itertools.count(1)
    with pytest.raises(PipelineError, match="stopped while waiting"):
        Placement(load_config(None), needs_critic=False, stop=lambda: next(looks) >= 3)  # stopped at the third look
    assert next(looks) == 4  # nothing looked again after the stop
    pending = [pg for pg in ray.util.placement_group_table().values() if pg["state"] in ("PENDING", "CREATED")]
    assert len(pending) == 1  # only the holder's
