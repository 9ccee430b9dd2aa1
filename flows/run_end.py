"""How `rlhf run` ends, whatever ended it: Ctrl-C or SIGTERM stops it within a bound, Prefect's temporary
server and its event and log workers are stopped within a bound, a store the run made fresh is removed
when it recorded no stage run, and a failure leaves one line on the terminal, not Prefect's traceback.

A Ctrl-C raises KeyboardInterrupt in the main thread, where the flow waits for its stage threads; the
flow then stops their work (`flows.services.ray_cluster.RaySession.stop`). A SIGTERM (what `timeout`, systemd's
stop and SLURM's cancel send, often to the whole process group) does the same: during the flow Prefect's
engine raises its TerminationSignal there, elsewhere `Terminated` is raised. A second Ctrl-C, or a stop
that takes longer than FORCE_EXIT_S, ends the process at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

FORCE_EXIT_S = 60.0  # after the first Ctrl-C or SIGTERM, the longest the orderly stop may take
DRAIN_S = 10.0  # the longest Prefect's event and log workers get to deliver what they hold
SERVER_START_S = 30.0  # the longest a failed run waits for the temporary server's start (Prefect gives it 20 s)
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
STOP_ADVICE = "stopped; rerun to resume"


class Terminated(Exception):
    """`rlhf run` stopped by a SIGTERM: one line, exit status 143 (128 + SIGTERM)."""


class StopBound:
    """The signal handlers of `bounded_interrupt`, and the bound on a stop under way (its timer, armed by
    the first Ctrl-C or SIGTERM)."""

    def __init__(self):
        from prefect.exceptions import ExternalSignal

        self.external = ExternalSignal
        self.timer: threading.Timer | None = None

    def arm(self, signum: int) -> None:
        if self.timer is None:
            self.timer = threading.Timer(FORCE_EXIT_S, force_exit, [f"still stopping after {FORCE_EXIT_S:g} s", signum])
            self.timer.daemon = True
            self.timer.start()

    def on_sigint(self, signum, frame):
        if self.timer is not None:
            force_exit("a second Ctrl-C")
        self.arm(signum)
        raise KeyboardInterrupt

    def on_sigterm(self, signum, frame):
        # Prefect's flow engine hands on the SIGTERM it stopped the flow for while its TerminationSignal
        # goes up: that stop is under way
        if self.timer is not None or isinstance(sys.exception(), self.external):
            return
        self.arm(signum)
        raise Terminated(STOP_ADVICE)


_bound: StopBound | None = None  # while `bounded_interrupt` runs


@contextlib.contextmanager
def bounded_interrupt():
    """While the block runs, the first SIGINT raises KeyboardInterrupt (as Python's own handler does) and
    a SIGTERM raises Terminated, each arming a timer; a second SIGINT, or the timer, ends the process (status
    130, or 143 after a SIGTERM). A SIGTERM while a stop is under way is ignored: its bound holds."""
    global _bound
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    bound = StopBound()
    previous = signal.signal(signal.SIGINT, bound.on_sigint), signal.signal(signal.SIGTERM, bound.on_sigterm)
    _bound = bound
    try:
        yield
    finally:
        _bound = None
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
        if bound.timer is not None:
            bound.timer.cancel()


def stop_began(signum: int) -> None:
    """In the main thread, when a stop began in another's signal handler (during the flow, Prefect's engine
    takes SIGTERM and raises its TerminationSignal): arm the bound, and take SIGTERM back, so that a
    repeated one (systemd's, SLURM's) leaves the stop going."""
    if _bound is not None:
        _bound.arm(signum)
        signal.signal(signal.SIGTERM, _bound.on_sigterm)


def stop_message(exc: BaseException) -> str:
    """What the flow said of a stop (`stopped during stage rl; rerun to resume`), else STOP_ADVICE."""
    said = exc.args[0] if exc.args else None
    return said if isinstance(said, str) and said else STOP_ADVICE


def force_exit(why: str, signum: int = signal.SIGINT) -> None:
    """End the process now, with the status of the signal that began the stop (130, or 143 for SIGTERM).
    The local Ray cluster's daemons die with it (Ray ties them to this process)."""
    if "prefect.server.api.server" in sys.modules:  # else no temporary server was started
        with contextlib.suppress(Exception):
            stop_temporary_server()
    word = "terminated" if signum == signal.SIGTERM else "interrupted"
    print(f"{word}: {why}; stopped without waiting for the stages; rerun to resume", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def stop_temporary_server() -> None:
    """Stop the temporary Prefect server this process started, if any (Prefect would at interpreter exit)."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the one instance the flow's client and `start_prefect_server` use
    if server.server_process is not None:
        server.stop()


def end_prefect(temporary_server: bool) -> None:
    """Deliver the flow run's last events and logs within DRAIN_S, then stop the temporary server (its
    'Stopping' line comes before the run's last line, and nothing is left to wait for at exit)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (EventsWorker, APILogWorker):
        with contextlib.suppress(Exception):
            worker.drain_all(timeout=DRAIN_S)
    if temporary_server:
        stop_temporary_server()


class NoRunTracebacks(logging.Filter):
    """Drops the flow and task runs' records that carry a traceback (Prefect's 'Encountered exception')."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.name.startswith(RUN_LOGGERS))


def hide_run_tracebacks() -> None:
    """On the terminal only: Prefect's own run logs (its UI) keep the traceback, the failed stage's MLflow
    run keeps it in the tag `rlhf.error`, and the CLI prints the one `error:` line."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(isinstance(f, NoRunTracebacks) for f in handler.filters):
            handler.addFilter(NoRunTracebacks())


class NoRayThreadSigtermWarning(logging.Filter):
    """Drops Ray's warning that `ray.init` outside the main thread sets no SIGTERM handler (a stage thread
    starts the cluster of a run whose first stage is cached): SIGTERM is the run's own (`bounded_interrupt`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def quiet_ray_thread_warning() -> None:
    logger = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, NoRayThreadSigtermWarning) for f in logger.filters):
        logger.addFilter(NoRayThreadSigtermWarning())


def remove_if_unused(state_dir: Path, uri: str) -> bool:
    """Remove a state folder this run created when no stage run was recorded in it (nothing to reuse or
    resume); returns whether it did. Kept when it holds a stage's work dir or the store names a stage run,
    or when the store cannot be read."""
    if not state_dir.is_dir() or (state_dir / "work").exists():
        return False
    db = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
    if db is not None and db.is_relative_to(state_dir) and db.exists():
        try:
            if stage_runs_recorded(uri):
                return False
        except Exception:  # noqa: BLE001 - a store that cannot be read is the user's to look at
            return False
    shutil.rmtree(state_dir, ignore_errors=True)
    return True


def stage_runs_recorded(uri: str) -> bool:
    from mlflow import MlflowClient

    from artifacts.run_tags import TAG_STAGE

    client = MlflowClient(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    return bool(ids) and any(TAG_STAGE in r.data.tags for r in client.search_runs(ids, max_results=1000))
