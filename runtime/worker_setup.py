"""What each worker process of the run's Ray job does first, before it imports a stage: Ray's
`worker_process_setup_hook`, which Ray runs only as the job's (`job_runtime_env`, given to `ray.init`),
so in every worker, the vLLM engine's interpreter too. The hook is `stages.common.worker_imports.mark_absent`,
which imports nothing but the standard library; what it keeps out, and why: stages/common/worker_imports.py."""

from stages.common.worker_imports import mark_absent


def job_runtime_env(env_vars: dict[str, str] | None = None) -> dict:
    """The runtime environment of every job the pipeline starts or joins (a new dict each time: Ray adds to
    the one it is given); an actor's own (its threads, the vLLM interpreter) adds to it. `env_vars`: what every
    worker's environment holds from its start (`determinism.env`: read before a process's first computation)."""
    hook = {"worker_process_setup_hook": f"{mark_absent.__module__}.{mark_absent.__name__}"}
    return {**hook, "env_vars": dict(env_vars)} if env_vars else hook
