"""Which stage failures are worth a rerun, and the Prefect task options that rerun them.

A transient fault (Ray lost a worker, a node or an object; the MLflow tracking server did not
answer, after MLflow's own HTTP retries) reruns the stage after `infra.retry_delay_s`, doubling each
time, up to `infra.retries` times (`infra.stage_retries` per stage); the rerun resumes from the
stage's last checkpoint. Any other error fails the stage at once: a user-facing error whatever led to
it, and an actor whose constructor raised (Ray reports it as a dead actor, but the constructor's own
error decides).
"""

from __future__ import annotations

import requests
from prefect.tasks import exponential_backoff
from ray import exceptions as ray_errors

from configs.errors import PipelineError
from configs.schema import PipelineConfig

RAY_FAULTS = (ray_errors.RayActorError, ray_errors.WorkerCrashedError, ray_errors.NodeDiedError,
              ray_errors.ObjectLostError, ray_errors.LocalRayletDiedError)
NETWORK_FAULTS = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError)


def creation_error(error: BaseException | None) -> BaseException | None:
    """The error an actor's constructor raised, behind the ActorDiedError Ray reports for the actor's
    calls (Ray keeps the creation task's RayTaskError as its argument); None for an actor Ray lost."""
    if not isinstance(error, ray_errors.RayActorError) or not error.actor_init_failed:
        return None
    return next((a.cause for a in error.args if isinstance(a, ray_errors.RayTaskError) and a.cause is not None), None)


def transient(error: BaseException | None) -> bool:
    """A Ray fault, or a network fault anywhere in the error's chain (MLflow wraps the one it gave up on);
    never a user-facing error, and for an actor whose constructor raised, only what that error is."""
    if isinstance(error, RAY_FAULTS) and not getattr(error, "actor_init_failed", False):
        return True
    if isinstance(error, ray_errors.RayActorError):
        error = creation_error(error)
    if isinstance(error, PipelineError):
        return False
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, NETWORK_FAULTS):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def retry_if_transient(task, task_run, state) -> bool:
    """Prefect's `retry_condition_fn`: the stage task returns its failed outcome as the state's data."""
    outcome = state.result(raise_on_failure=False)
    return transient(getattr(outcome, "error", outcome))


def task_options(cfg: PipelineConfig, stage: str) -> dict:
    retries = cfg.infra.stage_retries.get(stage, cfg.infra.retries)
    return {"retries": retries, "retry_delay_seconds": exponential_backoff(cfg.infra.retry_delay_s)(retries) if retries else 0,
            "retry_condition_fn": retry_if_transient}
