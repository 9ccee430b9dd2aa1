"""One Ray cluster per flow run: `RAY_ADDRESS` / `infra.ray_address` when set, else a local one.

It is joined lazily, by the first stage that has work to do, so a fully cached run starts no Ray;
`rlhf run` on a new store, where every stage will run, starts it at once (`start_early`).
On a local cluster of its own the session keeps stage workers for the next stage of the same shape
(`runtime.worker_pool.WorkerPool`); on a shared cluster each stage starts and frees its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from configs.errors import PipelineError, first_line
from configs.schema import InfraConfig, PipelineConfig
from runtime import ray_shutdown
from runtime.worker_setup import job_runtime_env
from stages.common import determinism
from stages.dag import declaration as dag
from stages.dag.contract import StageContext, StageResult, run_timed
from stages.dag.declaration import StageSpec

if TYPE_CHECKING:
    from runtime.worker_pool import Shape, WorkerPool

LOG_FLUSH_S = 1.0  # how long after a stage's Ray work ends its last worker lines may still be on their way


def log_flush_left(work_ended: float, now: float) -> float:
    """What is left of LOG_FLUSH_S at `now` for the lines of Ray work that ended at `work_ended` (the
    flow publishes the last stage's results meanwhile)."""
    return min(LOG_FLUSH_S, max(0.0, LOG_FLUSH_S - (now - work_ended)))


def token_env() -> dict[str, str]:
    """What a process that joins a `ray start` cluster sets to present the token this machine has
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); nothing where it has none."""
    if "RAY_AUTH_MODE" in os.environ:
        return {}
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or Path("~/.ray/auth_token").expanduser().is_file():
        return {"RAY_AUTH_MODE": "token"}
    return {}


def use_local_token() -> None:
    """Clusters from `ray start` expect token auth, but a driver given an explicit address assumes none:
    present the token this machine has. Ray reads the mode once, when first used in a process."""
    os.environ.update(token_env())


def named_address(infra: InfraConfig) -> str | None:
    """The cluster the user named (`RAY_ADDRESS`, else `infra.ray_address`); None: a local one of our own."""
    return os.environ.get("RAY_ADDRESS") or infra.ray_address


_started_early: RaySession | None = None  # by `rlhf run`, for the flow it is about to call


def start_early(cfg: PipelineConfig) -> None:
    """For `rlhf run` on a new store (no MLflow database yet, so no stage is cached and the first one will
    run): start the local cluster and the first stage's worker now, while Prefect starts its server
    and the flow's modules import; the flow's session takes them over (`session_for`)."""
    global _started_early
    from runtime.worker_pool import stage_shape

    first = next((s for s in dag.STAGES if not dag.pinned_away(s, cfg)), None)
    session = RaySession(cfg.infra)
    try:
        # in the main thread: started from a thread that then ended, the cluster's GCS was gone
        with sigterm_kept():
            session.ensure(None if first is None or first.driver else stage_shape(cfg.infra, first.distributed))
    except Exception as exc:  # noqa: BLE001 - the first stage's own start tries again and reports it as its error
        print(f"[ray] early start failed, the first stage will retry: {first_line(exc)}", flush=True)
    _started_early = session


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """ray.init in the main thread sets a SIGTERM handler of its own (sys.exit), which would skip the run's
    orderly stop (flows.run_end): the one before the block stays."""
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if sigterm is not None:  # None: a handler set outside Python, which Ray's replaced for good
            signal.signal(signal.SIGTERM, sigterm)


def drop_early() -> None:
    """Shut down an early session that no flow took over (the flow failed before it began)."""
    global _started_early
    early, _started_early = _started_early, None
    if early is not None:
        early.shutdown()


def import_all(modules: list[str]) -> None:
    import importlib

    for module in modules:
        with contextlib.suppress(Exception):  # the stage's own import reports any error, as its failure
            importlib.import_module(module)


_kept: RaySession | None = None  # by `kept_across_flows`, for each flow run in its block


@contextlib.contextmanager
def kept_across_flows(infra: InfraConfig) -> Iterator[RaySession]:
    """For several flow runs in this process, one after another (`rlhf verify` runs one per stage): one session
    that each of them takes, with its cluster and idle stage workers, and that only the end of this block shuts
    down, or a stop (Ctrl-C) during one of them."""
    global _kept
    session = RaySession(infra)
    session.kept = True
    _kept = session
    try:
        with sigterm_kept():
            session.ensure()  # here: a cluster started in a stage's task thread would not outlive that thread
        yield session
    finally:
        _kept = None
        session.kept = False
        session.shutdown(flush_logs=False)


def session_for(infra: InfraConfig) -> RaySession:
    """The flow's session: the one `kept_across_flows` keeps or `start_early` began for this config, else a new
    one, joined lazily."""
    global _started_early
    if _kept is not None and _kept.infra == infra and not _kept.stopping.is_set():
        return _kept
    early, _started_early = _started_early, None
    if early is not None and early.infra != infra:
        early.shutdown()  # started for another config: nothing may keep it running unowned
        early = None
    return early or RaySession(infra)


class RaySession:
    def __init__(self, infra: InfraConfig):
        self.infra = infra
        self.where: str | None = None
        self._lock = threading.Lock()
        self._owned = False
        self.pool: WorkerPool | None = None  # on a local cluster of its own
        self.stopping = threading.Event()  # set by `stop` (Ctrl-C): no stage starts or goes on with work here
        self.preload: dict[str, set[str]] = {}  # stage -> modules of the driver stages after it (`preload_drivers`)
        self._preload_lock = threading.Lock()  # stages start from several task threads at once
        self.work_ended = float("-inf")  # when the last stage's Ray work returned (time.monotonic)
        self.kept = False  # by `kept_across_flows`: a flow's end leaves it running; a stop does not

    def ensure(self, prestart: Shape | None = None) -> None:
        """Join or start the cluster, once (`prestart`: on a local cluster, start a stage worker set of
        this shape too, for the first stage to find idle)."""
        import ray

        with self._lock:
            if self.stopping.is_set():
                raise KeyboardInterrupt("the run is being stopped")
            if self.where is not None:
                return
            if ray.is_initialized():  # joined by the caller (e.g. a test or a notebook), who shuts it down
                self.where = "existing"
                ray_shutdown.reopen()  # a Ray of its own: an earlier session's stop does not concern it
                return
            address = named_address(self.infra)
            # before any process of the run computes: this one, and the workers a local cluster inherits it from
            determinism.export_env(self.infra.deterministic)
            env_vars = determinism.env(self.infra.deterministic)
            if address:
                use_local_token()
                try:
                    ray.init(address=address, log_to_driver=True, runtime_env=job_runtime_env(env_vars))
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    raise PipelineError(f"Ray cluster at {address} (RAY_ADDRESS / infra.ray_address): cannot connect ({exc})") from exc
                self.where = f"cluster at {address}"
            else:
                from runtime.resources import start_local_cluster
                from runtime.worker_pool import WorkerPool

                start_local_cluster(self.infra.num_cpus, env_vars=env_vars)
                self.where = "local cluster"

                self.pool = WorkerPool()  # idle workers would hold resources other users of a shared cluster need
                if prestart:
                    self.pool.prestart(prestart)
            self._owned = True
            ray_shutdown.reopen()
            if self.stopping.is_set():  # stopped while connecting, before `stop` saw a cluster of this session's
                ray_shutdown.close()
                raise KeyboardInterrupt("the run is being stopped")
            print(f"[ray] connected to {self.where}: {ray.cluster_resources().get('CPU', 0):g} CPU, "
                  f"{ray.cluster_resources().get('GPU', 0):g} GPU", flush=True)

    def run_stage(self, spec: StageSpec, ctx: StageContext, inputs: dict[str, Path], files=None) -> StageResult:
        """`files` (`artifacts.node_files.RunFiles`): the stage's workers share no disk with this process;
        `inputs` is empty and they exchange every file through the tracking server."""
        from runtime.worker_pool import run_driver_stage, run_stage

        self.ensure()
        if files is None:
            self.start_preloads(spec.name)
        try:
            if spec.driver:  # it starts actors of its own: no idle stage worker may hold their CPUs
                with self.pool.outside_work() if self.pool else contextlib.nullcontext():
                    if files is not None:
                        return run_driver_stage(spec.entrypoint, ctx, self.infra, files)
                    return run_timed(spec.load(), dataclasses.replace(ctx, should_stop=self.stopping.is_set), inputs)
            return run_stage(spec.entrypoint, ctx, inputs, self.infra, spec.distributed, self.pool, files)
        finally:
            self.work_ended = time.monotonic()

    def preload_drivers(self, cfg: PipelineConfig, scheduled: set[str]) -> None:
        """A driver stage (RL) runs in this process, and importing its module (torch, transformers' auto
        classes) takes seconds of one core. A stage that runs makes every stage that consumes it run too
        (its inputs are new), so once one of them starts, the scheduled driver stages after it are
        imported in the background while its workers compute."""
        for spec in dag.STAGES:
            if spec.driver and spec.name in scheduled:
                for name in dag.needed_by({spec.name}, cfg) & scheduled:
                    self.preload.setdefault(name, set()).add(spec.module)

    def start_preloads(self, stage: str) -> None:
        with self._preload_lock:
            modules = self.preload.pop(stage, set())
            for other in self.preload.values():
                other -= modules  # each module once
        if modules:
            threading.Thread(target=import_all, args=(sorted(modules),), name="preload-drivers", daemon=True).start()

    def stop(self) -> None:
        """Ctrl-C: end every stage's work on the cluster now. A driver stage sees `stopping` between its
        steps; disconnecting from Ray kills the actors this process owns (on a local cluster, the cluster
        itself), so the stage threads' pending Ray calls fail at once instead of running to the end."""
        self.stopping.set()
        if self._owned:  # Ray goes down below: a stage thread's call into it from now on would end this process
            ray_shutdown.close()
        self.shutdown(flush_logs=False)

    def shutdown(self, flush_logs: bool = True) -> None:
        import ray

        if self.kept and not self.stopping.is_set():  # the next flow run takes it
            return
        with self._lock:
            if self._owned:
                if flush_logs:  # let Ray's log monitor forward the last worker lines
                    time.sleep(log_flush_left(self.work_ended, time.monotonic()))
                ray.shutdown()  # with the pool's idle workers
            self._owned, self.where, self.pool = False, None, None
