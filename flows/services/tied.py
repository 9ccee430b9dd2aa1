"""A server that ends with the command that started it: `rlhf serve`'s and `rlhf ui`'s, which must not outlive
the command however it ends, a SIGKILL included. Linux's PR_SET_PDEATHSIG sends the server SIGTERM when the
process that started it dies; the servers stop their own children on SIGTERM (`mlflow ui` forwards it to its
uvicorn, Prefect's server shuts its services down)."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def tied_to(parent: int) -> Callable[[], None]:
    """A `preexec_fn` for subprocess.Popen run in `parent`: the child gets SIGTERM when `parent` dies (made in
    the child between fork and exec, so it holds for the program it becomes)."""

    def tie() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != parent:  # the parent died before the tie was made: nobody would send the signal
            os.kill(os.getpid(), signal.SIGTERM)

    return tie
