"""`infra.worker_resources`: the custom Ray resources that pin every stage worker and RL actor to the nodes
started with them (`ray start --resources`), as the bundles ask for them and the size checks count them."""

import pytest

from configs import PipelineError, load_config
from runtime.resources import bundle, cluster_name, node_capacity
from runtime.worker_pool import stage_shape
from stages.dag.preflight import check_local_resources


def node(alive: bool = True, **resources: float) -> dict:
    return {"Alive": alive, "Resources": resources}


HEAD = node(CPU=2)
WORKER = node(CPU=4, GPU=1, worker_node=100)


def test_every_bundle_asks_for_the_pinning_resources():
    assert bundle(2, 0, {}) == {"CPU": 2}
    assert bundle(2, 0.5, {"worker_node": 1}) == {"CPU": 2, "GPU": 0.5, "worker_node": 1}


def test_only_live_nodes_with_the_resources_count():
    nodes = [HEAD, WORKER, node(alive=False, CPU=8, worker_node=100), node(CPU=8, worker_node=0.5)]
    assert node_capacity(nodes, {}) == (14, 1)
    assert node_capacity(nodes, {"worker_node": 1}) == (4, 1)
    assert node_capacity(nodes, {"gpu_node": 1}) == (0, 0)


def test_the_shape_carries_the_resources_so_a_kept_worker_is_reused_only_under_the_same_pin():
    plain = load_config(None, [])
    pinned = load_config(None, ["infra.worker_resources={worker_node: 1}"])
    assert pinned.infra.worker_resources == {"worker_node": 1.0}
    assert stage_shape(plain.infra, False) == (1, 2, 0.0, ())
    assert stage_shape(pinned.infra, False) == (1, 2, 0.0, (("worker_node", 1.0),))
    assert cluster_name({}) == "the Ray cluster"
    assert cluster_name({"worker_node": 1.0}) == "the part of the Ray cluster with {worker_node: 1} (infra.worker_resources)"


def test_a_pin_on_the_local_cluster_is_one_line_before_anything_starts():
    cfg = load_config(None, ["infra.worker_resources={worker_node: 1}"])
    with pytest.raises(PipelineError, match=r"^infra.worker_resources=\{worker_node: 1\}: .* set RAY_ADDRESS"):
        check_local_resources(cfg)


def test_a_stage_waits_for_a_lost_node_only_as_long_as_node_wait_s(monkeypatch, capsys):
    """`infra.node_wait_s`: the size check looks again until the pinned nodes are back, then passes; with no
    wait, or when the wait runs out, it fails with its one line at once."""
    from runtime import resources, worker_pool

    clusters = iter([[HEAD], [HEAD, node(alive=False, CPU=4, worker_node=4)], [HEAD, WORKER]])
    monkeypatch.setattr(resources.ray, "nodes", lambda: next(clusters))
    monkeypatch.setattr(resources, "NODE_POLL_S", 0.01)
    shape = (2, 1, 0, (("worker_node", 1),))
    worker_pool.check_resources("sft", shape, wait_s=60)
    assert "[ray] waiting up to 60 s (infra.node_wait_s)" in capsys.readouterr().out
    monkeypatch.setattr(resources.ray, "nodes", lambda: [HEAD])
    for wait_s in (0, 0.05):
        with pytest.raises(PipelineError, match=r"stage sft needs 2 worker\(s\) x 1 CPU .* has 0 CPU"):
            worker_pool.check_resources("sft", shape, wait_s=wait_s)
