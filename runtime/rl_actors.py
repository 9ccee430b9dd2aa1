"""The RL stage's workers as Ray actors, placed by `Placement`: how the pipeline runs the stage."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import ray

from configs.schema import PipelineConfig
from runtime import ray_shutdown, rollout_engines
from runtime.resources import actor_class, capacity
from runtime.rl_placement import Placement, waves
from stages.dag.contract import NodeInputs
from stages.rl.backend import Ref, RolloutEngine
from stages.rl.layout import Role, check_async, resolve_layout

P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W")


class RayActors:
    """Starts, calls and stops the stage's workers as Ray actors (a `stages.rl.backend.Backend`)."""

    name = "ray"
    concurrent = True  # calls on different actors run at the same time (a collective among them can complete)

    def __init__(self):
        self.placement: Placement | None = None

    @property
    def placed(self) -> Placement:
        if self.placement is None:
            raise RuntimeError("RayActors: reserve() first")  # the driver's order: reserve, then start
        return self.placement

    @property
    def sizes(self) -> dict[Role, int]:
        return {role: len(slots) for role, slots in self.placed.slots.items()}

    def layout(self, cfg: PipelineConfig) -> PipelineConfig:
        # the flow resolves `rl.rollout.engine: auto` for a local cluster; on a named cluster it is resolved here
        resolved = resolve_layout(cfg, *capacity(cfg.infra.worker_resources))
        check_async(resolved)
        return resolved

    def reserve(self, cfg: PipelineConfig, needs_critic: bool, stop: Callable[[], bool]) -> None:
        rollout_engines.check(cfg, capacity(cfg.infra.worker_resources)[1])
        self.placement = Placement(cfg, needs_critic, stop=stop)

    def start(self, cls: type[W], role: Role, index: int, *args: Any) -> W:
        """The actor handle, typed as its worker class: `handle.method` is the actor method `call` launches."""
        slot = self.placed.slots[role][index]
        actor = actor_class(cast(type, cls))
        return cast(W, ray_shutdown.call(lambda: actor.options(**slot.options()).remote(*args, slot.threads)))

    def start_engines(self, cfg: PipelineConfig, given: NodeInputs) -> list[RolloutEngine]:
        return rollout_engines.start(cfg, given, self.placed.slots[Role.ENGINE])

    def call(self, method: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Ref[R]:
        remote = cast(Any, method).remote  # an actor handle's method: launched, not called
        return cast(Ref[R], ray_shutdown.call(lambda: remote(*args, **kwargs)))

    def get(self, refs: Sequence[Ref[R]], timeout: float | None = None) -> list[R]:
        """Ray's GetTimeoutError is a TimeoutError, as InProcess raises."""
        return ray.get(cast(list[Any], list(refs)), timeout=timeout)  # this backend's refs are Ray's

    def waves(self, groups: list[Role]) -> list[list[Role]]:
        return waves(self.placed.pools, groups, self.placed.hosts)

    def kill(self, worker: object) -> None:
        ray_shutdown.cleanup(lambda: ray.kill(cast(Any, worker)))

    def close(self, trainers: Sequence[object], everyone: Sequence[object]) -> None:
        try:
            ray.get(ray_shutdown.call(lambda: [cast(Any, w).close.remote() for w in trainers]), timeout=30)
        except (ray.exceptions.RayError, TimeoutError) as exc:  # the actors are killed next either way
            print(f"[rl] closing process groups: {type(exc).__name__}", flush=True)
        for worker in everyone:
            self.kill(worker)

    def release(self) -> None:
        if self.placement is not None:
            self.placement.release()
