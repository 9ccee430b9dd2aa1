"""The gate between Ray's shutdown on Ctrl-C and the stage threads' cleanup.

Ray ends the whole process, not the calling thread, when a call reaches its core worker while
`ray.shutdown` runs. A Ctrl-C shuts Ray down from the flow's thread while stage threads still hold
workers; their pending `ray.get` fails, and their cleanup (killing actors, removing placement groups)
would then call into Ray mid-shutdown. The shutdown ends those actors anyway, so from `close()` on the
cleanup is skipped. Ray is one per process, so the gate is too. No Ray import: the RL stage also runs
without Ray (`stages.rl.in_process`)."""

from __future__ import annotations

import threading
from collections.abc import Callable

_lock = threading.Lock()
_closed = False


def close() -> None:
    """Before `ray.shutdown` on a stop: waits for a cleanup already under way, then lets none start."""
    global _closed
    with _lock:
        _closed = True


def reopen() -> None:
    """A new connection to Ray (`ray.init`): cleanup calls go through again."""
    global _closed
    with _lock:
        _closed = False


def closed() -> bool:
    return _closed


def cleanup(call: Callable[[], object]) -> None:
    """`call` (it calls into Ray to free something), unless Ray is being shut down."""
    with _lock:
        if not _closed:
            call()
