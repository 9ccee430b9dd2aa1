"""Prefect's temporary server for `rlhf run`, in a session of its own.

Without PREFECT_API_URL, Prefect runs the flow against a temporary API server in a subprocess (its
`SubprocessASGIServer`). In the CLI's process group that server gets every signal sent to the group: a
Ctrl-C in the terminal, or the SIGTERM that `timeout`, systemd's stop and SLURM's cancel send to the
whole group, ended it at once, and the stopping flow's last states, logs and events then had nowhere to
go (Prefect's client retried them for minutes, then printed a traceback). Here the server runs in a
session of its own: only the CLI stops it, once the flow's end is written (`flows.run_end`). And it
stops itself when the CLI is gone (a SIGKILL leaves the CLI no time to), so nothing is left behind.

Prefect's clients find the server through `SubprocessASGIServer()`, which returns one shared instance:
starting `SessionServer()` first makes it that instance.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings

ORPHAN_POLL_S = 0.5  # how often the server looks for the CLI that started it


class SessionServer(SubprocessASGIServer):
    """Prefect's temporary server, started by `main` below in a session of its own."""

    def _run_uvicorn_command(self) -> subprocess.Popen:
        # the environment Prefect (3.8.8, pinned) gives its temporary server: no UI, ephemeral mode
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               **get_current_settings().to_environment_variables(exclude_unset=True)}
        return subprocess.Popen([sys.executable, "-m", "flows.services.prefect_server", str(self.port), str(os.getpid())],
                                env=env, start_new_session=True)


def stop_when_orphaned(parent: int) -> None:
    """SIGTERM this process (uvicorn's orderly shutdown) once `parent` is no longer its parent."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> None:
    """The server process: `python -m flows.services.prefect_server PORT PARENT_PID`. uvicorn exits with 3 when the port
    is taken, which Prefect's start answers with another port."""
    port, parent = int(argv[0]), int(argv[1])
    threading.Thread(target=stop_when_orphaned, args=(parent,), name="orphan-watch", daemon=True).start()
    import uvicorn

    uvicorn.run("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                log_level="error", lifespan="on", app_dir=str(prefect.__module_path__.parent))


def start_in_background() -> threading.Thread | None:
    """Without PREFECT_API_URL, calling the flow starts Prefect's temporary server: a process that imports
    the server and creates its database (seconds). Starting it first, in a thread, lets the flow's
    imports and the early Ray start run meanwhile; the flow then finds it running. A new database starts
    as a copy of an empty migrated one (flows/services/prefect_db.py)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None
    from flows.services import prefect_db

    keep_template = prefect_db.seeded()
    server = SessionServer()  # in a session of its own: a signal to this process group leaves it to us to stop

    def start() -> None:
        with contextlib.suppress(Exception):  # the flow's own start tries again and reports the error
            server.start()
            keep_template()

    thread = threading.Thread(target=start, name="prefect-server-start", daemon=True)
    thread.start()
    return thread


if __name__ == "__main__":
    main(sys.argv[1:])
