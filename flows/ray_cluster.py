"""One Ray cluster per flow run: `RAY_ADDRESS` / `infra.ray_address` when set, else a local one.

It is joined lazily, by the first stage that has work to do, so a fully cached run starts no Ray.
On a local cluster of its own the session keeps stage workers for the next stage of the same shape
(`stages.common.ray_workers.WorkerPool`); on a shared cluster each stage starts and frees its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from configs.errors import PipelineError
from configs.schema import InfraConfig
from stages.contract import StageContext, StageResult, run_timed
from stages.dag import StageSpec

LOG_FLUSH_S = 1.0


def use_local_token() -> None:
    """Clusters from `ray start` expect token auth, but a driver given an explicit address assumes none:
    present the token this machine has (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or Path("~/.ray/auth_token").expanduser().is_file():
        os.environ["RAY_AUTH_MODE"] = "token"


class RaySession:
    def __init__(self, infra: InfraConfig):
        self.infra = infra
        self.where: str | None = None
        self._lock = threading.Lock()
        self._owned = False
        self.pool = None  # stages.common.ray_workers.WorkerPool on a local cluster of its own

    def ensure(self) -> None:
        import ray

        with self._lock:
            if self.where is not None:
                return
            if ray.is_initialized():  # joined by the caller (e.g. a test or a notebook)
                self.where = "existing"
                return
            address = os.environ.get("RAY_ADDRESS") or self.infra.ray_address
            if address:
                use_local_token()
                try:
                    ray.init(address=address, log_to_driver=True)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    raise PipelineError(f"Ray cluster at {address} (RAY_ADDRESS / infra.ray_address): cannot connect ({exc})") from exc
                self.where = f"cluster at {address}"
            else:
                from stages.common.ray_workers import WorkerPool, start_local_cluster

                start_local_cluster(self.infra.num_cpus)
                self.where = "local cluster"

                self.pool = WorkerPool()  # idle workers would hold resources other users of a shared cluster need
            self._owned = True
            print(f"[ray] connected to {self.where}: {ray.cluster_resources().get('CPU', 0):g} CPU, "
                  f"{ray.cluster_resources().get('GPU', 0):g} GPU", flush=True)

    def run_stage(self, spec: StageSpec, ctx: StageContext, inputs: dict[str, Path]) -> StageResult:
        from stages.common.ray_workers import run_stage

        self.ensure()
        if spec.driver:  # it starts actors of its own: no idle stage worker may hold their CPUs
            with self.pool.outside_work() if self.pool else contextlib.nullcontext():
                return run_timed(spec.load(), ctx, inputs)
        return run_stage(spec.entrypoint, ctx, inputs, self.infra, spec.distributed, self.pool)

    def shutdown(self) -> None:
        import ray

        with self._lock:
            if self._owned:
                time.sleep(LOG_FLUSH_S)  # let Ray's log monitor forward the last worker lines
                ray.shutdown()  # with the pool's idle workers
            self._owned, self.where, self.pool = False, None, None
