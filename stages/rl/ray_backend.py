"""The RL stage's workers as Ray actors, placed by `Placement`: how the pipeline runs the stage."""

from __future__ import annotations

import ray

from configs.schema import PipelineConfig
from stages.common import ray_shutdown
from stages.common.ray_workers import actor_class, capacity
from stages.contract import NodeInputs
from stages.rl import rollout_engines
from stages.rl.layout import Role, check_async, resolve_layout
from stages.rl.placement import Placement, waves


class RayActors:
    """Starts, calls and stops the stage's workers as Ray actors (the interface of InProcess)."""

    name = "ray"
    concurrent = True  # calls on different actors run at the same time (a collective among them can complete)

    def __init__(self):
        self.placement: Placement | None = None

    @property
    def sizes(self) -> dict[Role, int]:
        return {role: len(slots) for role, slots in self.placement.slots.items()}

    def resources(self, cfg: PipelineConfig) -> tuple[float, float]:
        return capacity(cfg.infra.worker_resources)

    def layout(self, cfg: PipelineConfig) -> PipelineConfig:
        # the flow resolves `rl.rollout.engine: auto` for a local cluster; on a named cluster it is resolved here
        resolved = resolve_layout(cfg, *self.resources(cfg))
        check_async(resolved)
        return resolved

    def reserve(self, cfg: PipelineConfig, needs_critic: bool, stop) -> None:
        rollout_engines.check(cfg, self.resources(cfg)[1])
        self.placement = Placement(cfg, needs_critic, stop=stop)

    def start(self, cls: type, role: Role, index: int, *args):
        slot = self.placement.slots[role][index]
        return ray_shutdown.call(lambda: actor_class(cls).options(**slot.options()).remote(*args, slot.threads))

    def start_engines(self, cfg: PipelineConfig, given: NodeInputs) -> list:
        return rollout_engines.start(cfg, given, self.placement.slots[Role.ENGINE])

    def call(self, actor, method: str, *args):
        return ray_shutdown.call(lambda: getattr(actor, method).remote(*args))

    def get(self, refs, timeout: float | None = None):
        """Ray's GetTimeoutError is a TimeoutError, as InProcess raises."""
        return ray.get(refs, timeout=timeout)

    def waves(self, groups: list[Role]) -> list[list[Role]]:
        return waves(self.placement.pools, groups, self.placement.hosts)

    def kill(self, actor) -> None:
        ray_shutdown.cleanup(lambda: ray.kill(actor))

    def close(self, trainers: list, everyone: list) -> None:
        try:
            ray.get(ray_shutdown.call(lambda: [w.close.remote() for w in trainers]), timeout=30)
        except (ray.exceptions.RayError, TimeoutError) as exc:  # the actors are killed next either way
            print(f"[rl] closing process groups: {type(exc).__name__}", flush=True)
        for actor in everyone:
            ray_shutdown.cleanup(lambda actor=actor: ray.kill(actor))

    def release(self) -> None:
        if self.placement is not None:
            self.placement.release()
