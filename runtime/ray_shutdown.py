"""The gate between Ray's shutdown on Ctrl-C and the stage threads' calls into Ray.

Ray ends the whole process, not the calling thread, when a call reaches its core worker while
`ray.shutdown` runs. A Ctrl-C shuts Ray down from the flow's thread while stage threads still hold
workers; their pending `ray.get` fails, and their cleanup (killing actors, removing placement groups)
would then call into Ray mid-shutdown, as would a stage about to start its workers. From `close()` on,
cleanup is skipped (the shutdown ends those actors anyway) and a call that would start work raises
KeyboardInterrupt. Blocking waits (`ray.get`, `ray.wait`) stay outside the gate: they fail on their own
when Ray goes, and holding the gate through them would hold up the stop. Ray is one per process, so the
gate is too. No Ray import: the RL stage also runs without Ray (`stages.rl.in_process`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_closed = False


def close() -> None:
    """Before `ray.shutdown` on a stop: no call starts from here on; returns once the one under way ended."""
    global _closed
    _closed = True  # first, so that a second Ctrl-C during the wait below leaves the gate closed
    with _lock:
        pass


def reopen() -> None:
    """A new connection to Ray (`ray.init`): calls go through again."""
    global _closed
    with _lock:
        _closed = False


def call(fn: Callable[[], T]) -> T:
    """`fn()` (a short call into Ray that starts or looks up work); KeyboardInterrupt once Ray is shutting down."""
    with _lock:
        if _closed:
            raise KeyboardInterrupt("Ray is shutting down: the run is being stopped")
        return fn()


def cleanup(fn: Callable[[], object]) -> None:
    """`fn()` (it calls into Ray to free something), unless Ray is being shut down."""
    with _lock:
        if not _closed:
            fn()
