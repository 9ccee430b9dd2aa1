"""What each worker process of the run's Ray job does first, before it imports a stage: Ray's
`worker_process_setup_hook`, which Ray runs only as the job's (`job_runtime_env`, given to `ray.init`),
so in every worker, the vLLM engine's interpreter too: this module imports nothing but the standard library.

transformers imports scikit-learn at start-up wherever it is installed (MLflow depends on it), for an
option of assisted decoding that no stage sets; scikit-learn brings SciPy's statistics with it, a second
or more of each worker's start (docs/benchmarks.md). Marked absent in the worker, both stay out."""

import sys

NOT_IMPORTED_IN_WORKERS = ("sklearn",)


def skip_unused_imports() -> None:
    """`sys.modules[name] = None`: Python's own mark of a module that is not there (`import` raises
    ImportError, `importlib.util.find_spec` answers None, which is how transformers asks)."""
    for name in NOT_IMPORTED_IN_WORKERS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None is the mark


def job_runtime_env() -> dict:
    """The runtime environment of every job the pipeline starts or joins (a new dict each time: Ray adds to
    the one it is given); an actor's own (its threads, the vLLM interpreter) adds to it."""
    return {"worker_process_setup_hook": f"{__name__}.{skip_unused_imports.__name__}"}
