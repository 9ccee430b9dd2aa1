"""Where the RL stage's actors run: one placement group per set of colocated actor groups.

Colocated groups share the same bundles (each bundle = `infra.cpus_per_worker` CPUs and
`infra.gpus_per_worker` GPUs), each actor taking an equal fraction of its bundle, as OpenRLHF
shares GPUs between the actor and reference models. They take turns (rollout, then scoring,
then training; within experience making, one model after the other: `waves`), so every actor may
use all of its bundle's cores.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from configs.errors import PipelineError
from configs.schema import PipelineConfig
from runtime import ray_shutdown
from runtime.resources import bundle, capacity_within, cluster_name, thread_env
from stages.rl.layout import Role, bundles_needed, check_fits, group_sizes, hosts, pools


@dataclass
class Slot:
    """Scheduling options for one actor."""

    pg: PlacementGroup
    bundle: int
    num_cpus: float
    num_gpus: float
    threads: int

    def options(self) -> dict:
        return {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=self.bundle),
            **thread_env(self.threads),
        }


def waves(pools: list[list[Role]], groups: list[Role], hosts: dict[Role, Role] | None = None) -> list[list[Role]]:
    """`groups` in waves whose members share no pool: a wave's groups may run at once, the waves one
    after another. Colocated groups running at once would oversubscribe the cores they share, and both
    would take longer than the two in turn. `hosts` names the group whose actors a group runs in
    (hybrid: the reference lives in the policy ranks)."""
    hosts = hosts or {}

    def colocated(a: Role, b: Role) -> bool:
        a, b = hosts.get(a, a), hosts.get(b, b)
        # calls to the same actors run one after another anyway: no need to wait between them
        return a != b and any(a in pool and b in pool for pool in pools)

    out: list[list[Role]] = []
    for group in groups:
        wave = next((w for w in out if not any(colocated(group, other) for other in w)), None)
        if wave is None:
            out.append([group])
        else:
            wave.append(group)
    return out


class Placement:
    """Reserves the bundles for every pool and hands out one Slot per actor. While another stage holds the
    cluster's resources the reservation waits its turn (the cluster can fit it, or `check_fits` said so)."""

    WAIT_NOTE_S = 30.0  # how often a waiting stage says what it waits for

    def __init__(self, cfg: PipelineConfig, needs_critic: bool, stop: Callable[[], bool] = lambda: False):
        infra = cfg.infra
        self.sizes = group_sizes(cfg, needs_critic)
        self.hosts = hosts(cfg)
        self.pools = pools(cfg, list(self.sizes))
        cpus, gpus = infra.cpus_per_worker, infra.gpus_per_worker
        self.cfg, self.needs_critic = cfg, needs_critic
        self.check_cluster()
        self.groups: list[PlacementGroup] = []
        self.slots: dict[Role, list[Slot]] = {}
        for pool in self.pools:
            n = max(self.sizes[g] for g in pool)
            each = bundle(cpus, gpus, infra.worker_resources)
            pg = ray_shutdown.call(functools.partial(placement_group, [each] * n, strategy="PACK"))
            self.groups.append(pg)  # released with the others if the wait is stopped
            self._wait_for(pg, n, each, stop)
            share = len(pool)
            for g in pool:
                self.slots[g] = [Slot(pg, i, cpus / share, gpus / share, max(1, int(cpus))) for i in range(self.sizes[g])]

    def _wait_for(self, pg: PlacementGroup, n: int, bundle: dict, stop: Callable[[], bool]) -> None:
        waited, ready, pending = 0.0, False, ray_shutdown.call(pg.ready)
        while not ready:
            if stop():
                self.release()
                raise PipelineError("stage rl: stopped while waiting for the Ray cluster's resources")
            ready = bool(ray.wait([pending], timeout=1.0)[0])
            waited += 1.0
            if not ready:
                try:
                    self.check_cluster()  # the resources are held by other work, not gone with a node
                except PipelineError:
                    self.release()
                    raise
            if not ready and waited % self.WAIT_NOTE_S == 0:
                print(f"[rl] waiting {waited:.0f}s for {n} bundle(s) of {bundle}: another stage holds the cluster's "
                      f"resources", flush=True)

    def check_cluster(self) -> None:
        """One line when the cluster cannot fit the layout, once `infra.node_wait_s` has passed for nodes to join."""
        infra = self.cfg.infra
        need_cpu, need_gpu = bundles_needed(self.cfg, self.needs_critic)
        have = capacity_within(infra.worker_resources, lambda c, g: need_cpu <= c and need_gpu <= g, infra.node_wait_s)
        check_fits(self.cfg, *have, cluster_name(infra.worker_resources))

    def release(self) -> None:
        groups, self.groups = self.groups, []
        for pg in groups:
            ray_shutdown.cleanup(functools.partial(remove_placement_group, pg))
