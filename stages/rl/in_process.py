"""The RL stage's workers as plain objects in the driver's process: one rank per model, no Ray.

For a machine where Ray cannot go (a bare GPU box checked with `benchmarks/gpu_stages.py`) and for
stepping through the stage in a debugger. The driver's code is the pipeline's (stages/rl/stage.py);
only how it reaches its workers differs from runtime/rl_actors.py: a call runs when its result is
first asked for, in this process, as a Ray call would have run by then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, cast

import torch

from configs.errors import ConfigError
from configs.schema import PipelineConfig
from stages.dag.contract import NodeInputs
from stages.rl import workers
from stages.rl.backend import Ref, RolloutEngine
from stages.rl.layout import Role, group_sizes

P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W")


class Pending(Generic[R]):
    """A call on an in-process worker, made once, when its result (or a call given it) is first needed."""

    def __init__(self, fn: Callable[..., R], args: tuple, kwargs: dict[str, Any]):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done, self.value = False, cast(R, None)

    def result(self) -> R:
        if not self.done:
            # a Pending passed as an argument stands for its result, as an object ref does in Ray
            self.value = self.fn(*(a.result() if isinstance(a, Pending) else a for a in self.args), **self.kwargs)
            self.done = True
        return self.value


def layout(cfg: PipelineConfig) -> PipelineConfig:
    """The config as one process runs it: `rl.rollout.engine: auto` becomes hybrid (an HF engine beside the policy
    under ZeRO-3, whose partitions the policy cannot sample with); vLLM, which runs in processes of its own,
    and more than one rank per model are refused in one line."""
    rl = cfg.rl
    if rl.rollout.engine == "vllm":
        raise ConfigError("rl.rollout.engine=vllm: vLLM runs in processes of its own, which a one-process RL run does "
                          "not start; use rl.rollout.engine: hybrid or hf")
    for key, n in (("rl.actor.num_workers", rl.actor.num_workers), ("rl.critic.num_workers", rl.critic.num_workers)):
        if n != 1:
            raise ConfigError(f"{key}={n}: a one-process RL run has one rank per model; set it to 1")
    if rl.rollout.async_train:
        raise ConfigError("rl.rollout.async_train: a one-process RL run calls its workers one after another, so nothing "
                          "generates while the policy trains; run the stage on Ray, or set rl.rollout.async_train: false")
    if rl.rollout.engine != "auto":
        return cfg
    resolved = cfg.model_copy(deep=True)
    resolved.rl.rollout.engine = "hybrid" if cfg.infra.zero_stage != 3 else "hf"
    return resolved


class InProcess:
    """Starts, calls and stops the stage's workers in this process (a `stages.rl.backend.Backend`)."""

    name = "in-process"
    concurrent = False  # one call after another: no collective among workers

    def __init__(self):
        self.sizes: dict[Role, int] = {}
        self.threads = torch.get_num_threads()

    def layout(self, cfg: PipelineConfig) -> PipelineConfig:
        return layout(cfg)

    def reserve(self, cfg: PipelineConfig, needs_critic: bool, stop: Callable[[], bool]) -> None:
        self.sizes = group_sizes(cfg, needs_critic)

    def start(self, cls: type[W], role: Role, index: int, *args: Any) -> W:
        return cast(Any, cls)(*args, self.threads)  # every worker class takes its thread count last

    def start_engines(self, cfg: PipelineConfig, given: NodeInputs) -> list[RolloutEngine]:
        return [workers.HFRolloutEngine(cfg, given, self.threads) for _ in range(self.sizes[Role.ENGINE])]

    def call(self, method: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> Ref[R]:
        return Pending(method, args, kwargs)

    def get(self, refs: Sequence[Ref[R]], timeout: float | None = None) -> list[R]:
        """The results of `refs`, in order. With `timeout`, a call still running after it raises
        TimeoutError: it runs in a thread that is left behind (nothing stops a Python call), as the stage ends."""
        pending = [cast(Pending[R], r) for r in refs]  # this backend's own refs
        if timeout is None:
            return [p.result() for p in pending]
        out: list[R] = []
        failed: list[BaseException] = []

        def run() -> None:
            try:
                out.extend(p.result() for p in pending)
            except BaseException as exc:  # re-raised in the caller's thread
                failed.append(exc)

        thread = threading.Thread(target=run, daemon=True, name="rl-call")
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"calls still running after {timeout:g} s")
        if failed:
            raise failed[0]
        return out

    def waves(self, groups: list[Role]) -> list[list[Role]]:
        return [[g] for g in groups]  # one process: one call at a time anyway

    def kill(self, worker: object) -> None:
        """Nothing to kill: a worker's memory goes with the last reference to it."""

    def close(self, trainers: Sequence[object], everyone: Sequence[object]) -> None:
        for worker in trainers:
            cast(workers.TrainerWorker, worker).close()

    def release(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
