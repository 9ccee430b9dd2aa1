"""Modules no stage uses that a library would import anyway, kept out of the stage workers.

transformers imports scikit-learn at start-up wherever it is installed (MLflow depends on it), for an
option of assisted decoding that no stage sets; scikit-learn brings SciPy's statistics with it, a second
or more of each worker's start. Its losses import SciPy's optimizers for the object-detection loss, which
no stage computes: a few tenths of a second more (docs/benchmarks.md). A Ray worker marks them absent
before it imports a stage (runtime/worker_setup.py). A user's reward_func.py or agent_func.py may use
them, so the marks are lifted before it runs (a rule function's reward worker has not imported
transformers by then: if the file does, transformers finds scikit-learn as it would anywhere).
Only the standard library here: the vLLM engine's interpreter runs the mark too."""

import contextlib
import sys
from collections.abc import Iterator

NOT_IMPORTED_IN_WORKERS = ("sklearn", "scipy")


def mark_absent() -> None:
    """`sys.modules[name] = None`: Python's own mark of a module that is not there (`import` raises
    ImportError, `importlib.util.find_spec` answers None, which is how transformers asks)."""
    for name in NOT_IMPORTED_IN_WORKERS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None is the mark


def lift_marks() -> None:
    """Undo `mark_absent` (and only it: a mark set by anyone else stays) before a user's file runs."""
    for name in NOT_IMPORTED_IN_WORKERS:
        if name in sys.modules and sys.modules[name] is None:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def absent_while_importing(name: str) -> Iterator[None]:
    """`name` marked absent for the block when nothing has imported it yet, then importable again: for a
    library that imports it at start-up only to offer a feature no stage uses."""
    if name in sys.modules:
        yield
        return
    sys.modules[name] = None  # type: ignore[assignment]  # None is the mark
    try:
        yield
    finally:
        if sys.modules.get(name, ...) is None:
            del sys.modules[name]
