"""Where the RL stage's actors run: one placement group per set of colocated actor groups.

Colocated groups share the same bundles (each bundle = `infra.cpus_per_worker` CPUs and
`infra.gpus_per_worker` GPUs), each actor taking an equal fraction of its bundle, as OpenRLHF
shares GPUs between the actor and reference models. They take turns (rollout, then scoring,
then training; within experience making, one model after the other: `waves`), so every actor may
use all of its bundle's cores.
"""

from __future__ import annotations

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
from stages.common.ray_workers import thread_env


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


def hosts(cfg: PipelineConfig) -> dict[str, str]:
    """The groups with no actors of their own, and the group whose actors do their work (hybrid: the
    policy ranks sample themselves and hold the reference)."""
    return {"engine": "actor", "ref": "actor"} if cfg.rl.engine == "hybrid" else {}


def group_sizes(cfg: PipelineConfig, needs_critic: bool) -> dict[str, int]:
    rl = cfg.rl
    sizes = {"actor": rl.actor.num_workers, "engine": rl.num_engines, "reward": rl.reward_num_workers}
    if rl.needs_reference:
        sizes["ref"] = rl.ref_num_workers
    if needs_critic:
        sizes["critic"] = rl.critic.num_workers
    hosted = hosts(cfg)
    return {group: n for group, n in sizes.items() if group not in hosted}


def pools(cfg: PipelineConfig, groups: list[str]) -> list[list[str]]:
    """The sets of groups that share bundles, from the colocate_* options."""
    rl = cfg.rl
    if rl.colocate_all:
        return [groups]
    together = []
    if rl.colocate_actor_ref:
        together.append([g for g in ("actor", "ref") if g in groups])
    if rl.colocate_critic_reward:
        together.append([g for g in ("critic", "reward") if g in groups])
    placed = {g for pool in together for g in pool}
    return [p for p in together if p] + [[g] for g in groups if g not in placed]


def waves(pools: list[list[str]], groups: list[str], hosts: dict[str, str] | None = None) -> list[list[str]]:
    """`groups` in waves whose members share no pool: a wave's groups may run at once, the waves one
    after another. Colocated groups running at once would oversubscribe the cores they share (on the
    2-core tiny preset, experience making took 0.69 s per step with the policy's and the reference's
    forward passes at once, 0.26 s in turn). `hosts` names the group whose actors a group runs in
    (hybrid: the reference lives in the policy ranks)."""
    hosts = hosts or {}

    def colocated(a: str, b: str) -> bool:
        a, b = hosts.get(a, a), hosts.get(b, b)
        # calls to the same actors run one after another anyway: no need to wait between them
        return a != b and any(a in pool and b in pool for pool in pools)

    out: list[list[str]] = []
    for group in groups:
        wave = next((w for w in out if not any(colocated(group, other) for other in w)), None)
        if wave is None:
            out.append([group])
        else:
            wave.append(group)
    return out


class Placement:
    """Reserves the bundles for every pool and hands out one Slot per actor."""

    def __init__(self, cfg: PipelineConfig, needs_critic: bool, timeout_s: float = 120.0):
        infra = cfg.infra
        self.sizes = group_sizes(cfg, needs_critic)
        self.hosts = hosts(cfg)
        self.pools = pools(cfg, list(self.sizes))
        cpus, gpus = infra.cpus_per_worker, infra.gpus_per_worker
        need_cpu = sum(max(self.sizes[g] for g in pool) for pool in self.pools) * cpus
        need_gpu = sum(max(self.sizes[g] for g in pool) for pool in self.pools) * gpus
        have = ray.cluster_resources()
        if need_cpu > have.get("CPU", 0) or need_gpu > have.get("GPU", 0):
            raise PipelineError(
                f"stage rl needs {need_cpu:g} CPU / {need_gpu:g} GPU for its actor groups {self.pools} "
                f"(infra.cpus_per_worker={cpus:g}), but the Ray cluster has {have.get('CPU', 0):g} CPU / "
                f"{have.get('GPU', 0):g} GPU; set rl.colocate_all: true or use fewer workers"
            )
        self.groups: list[PlacementGroup] = []
        self.slots: dict[str, list[Slot]] = {}
        for pool in self.pools:
            n = max(self.sizes[g] for g in pool)
            bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
            pg = placement_group([bundle] * n, strategy="PACK")
            ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
            if not ready:
                remove_placement_group(pg)
                raise PipelineError(f"stage rl: the Ray cluster did not grant {n} bundle(s) of {bundle} within {timeout_s:g}s")
            self.groups.append(pg)
            share = len(pool)
            for g in pool:
                self.slots[g] = [Slot(pg, i, cpus / share, gpus / share, max(1, int(cpus))) for i in range(self.sizes[g])]

    def release(self) -> None:
        for pg in self.groups:
            remove_placement_group(pg)
