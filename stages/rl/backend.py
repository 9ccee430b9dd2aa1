"""What the RL driver needs from whatever runs its workers: one typed interface, two implementations
(Ray actors in the pipeline, `runtime.rl_actors.RayActors`; plain objects in this process,
`stages.rl.in_process.InProcess`).

Workers are called by method reference, `backend.call(worker.train, batch, step)`: the arguments are
checked against the worker method's signature by the type checker, and a renamed method fails there,
not in the middle of a run. A worker handle is typed as its worker class (`start` returns it so); on
Ray it is the actor handle, whose `worker.train` is the actor method that `call` launches remotely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from configs.schema import PipelineConfig
from stages.dag.contract import NodeInputs
from stages.rl.layout import Role

if TYPE_CHECKING:
    import torch

    from stages.rl.experience import Sample
    from stages.rl.weight_sync import Spec

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
W = TypeVar("W")


class Ref(Protocol[R_co]):
    """A launched call's result to come: a Ray object ref, or an in-process pending call. Only the
    backend that made it reads it (`get`); passed as an argument to another call, it stands for its result."""


class Sampler(Protocol):
    """What samples a rollout: an engine actor, or a policy rank of the hybrid layout."""

    def ready(self) -> bool: ...

    def generate(self, prompt_ids: list[list[int]], seed: int, temperature: float | None, max_new_tokens: int,
                 top_p: float = 1.0, stop: tuple[str, ...] = ()) -> list[Sample]: ...


class RolloutEngine(Sampler, Protocol):
    """An engine actor (HF or vLLM) that takes the policy's weights after each update."""

    def torch_version(self) -> str: ...

    def device_type(self) -> str: ...

    def join_weight_group(self, master: tuple[str, int], rank: int, world_size: int, backend: str) -> None: ...

    def weight_specs(self) -> list[Spec]: ...

    def receive_weights(self, wanted: list[Spec]) -> None: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...


class Backend(Protocol):
    name: str
    concurrent: bool  # calls on different workers run at the same time (a collective among them can complete)

    @property
    def sizes(self) -> dict[Role, int]:
        """How many workers each role has of its own, once reserved."""
        ...

    def layout(self, cfg: PipelineConfig) -> PipelineConfig:
        """The config as this backend runs it (`rl.rollout.engine: auto` resolved; what it cannot run refused)."""
        ...

    def reserve(self, cfg: PipelineConfig, needs_critic: bool, stop: Callable[[], bool]) -> None:
        """Hold the resources every worker will run on (waiting while `stop()` is false)."""
        ...

    def start(self, cls: type[W], role: Role, index: int, *args: Any) -> W:
        """Worker `index` of `role`, constructed as `cls(*args, threads)` where the backend places it."""
        ...

    def start_engines(self, cfg: PipelineConfig, given: NodeInputs) -> list[RolloutEngine]: ...

    def call(self, method: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Ref[R]:
        """Launch `method` (a worker's, by reference); its result comes from `get`."""
        ...

    def get(self, refs: Sequence[Ref[R]], timeout: float | None = None) -> list[R]:
        """The results of launched calls, in order; TimeoutError after `timeout` seconds."""
        ...

    def waves(self, groups: list[Role]) -> list[list[Role]]:
        """`groups` in waves: the groups of a wave share no cores and run at once."""
        ...

    def kill(self, worker: object) -> None: ...

    def close(self, trainers: Sequence[object], everyone: Sequence[object]) -> None: ...

    def release(self) -> None: ...


def one(backend: Backend, ref: Ref[R], timeout: float | None = None) -> R:
    """The result of one launched call."""
    return backend.get([ref], timeout)[0]
