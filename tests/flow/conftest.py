"""End-to-end tests drive the real `rlhf` CLI, in a subprocess or through its `main` in the test's process
(`cli`, `main_in_process`): real Prefect (the tests' shared server, or a run's temporary one), a real local
Ray cluster, real DeepSpeed engines and an MLflow SQLite store in a temp folder."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from stages.common.dist_env import free_port

CLI = [sys.executable, "-m", "flows.cli.main"]


SHARED_PREFECT = "RLHF_TEST_PREFECT_API_URL"  # set by the `prefect_server` fixture


def cli_env(workdir: Path) -> dict[str, str]:
    """The environment of a CLI subprocess: nothing of the caller's MLflow, Ray or Prefect, except the
    tests' shared Prefect server when one runs (else each run starts a temporary one of its own)."""
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("RAY_ADDRESS", None)
    env.pop("PREFECT_API_URL", None)
    if env.get(SHARED_PREFECT):
        env["PREFECT_API_URL"] = env[SHARED_PREFECT]
    env["PYTHONUNBUFFERED"] = "1"
    return env


# The server's loop services that act on schedules, late or paused runs, work pools and automations: the
# flow tests' runs report to this server, and no deployment runs on it (the served deployments and the
# cluster's work pool have servers of their own). Off, an idle server uses less CPU (docs/benchmarks.md).
IDLE_SERVICES_OFF = {f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in (
    "SCHEDULER", "LATE_RUNS", "PAUSE_EXPIRATIONS", "REPOSSESSOR", "CLEANUP_RECONCILER", "FOREMAN",
    "CANCELLATION_CLEANUP", "TRIGGERS")}


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real Prefect server (`prefect server start`) that the flow tests' CLI runs report to, started
    once: a run that has to start its own temporary server pays several seconds for it."""
    from flows.cli.serve import prefect_server as start_server
    from flows.cli.serve import stop

    saved = os.environ.pop("PREFECT_API_URL", None)
    before = {key: os.environ.get(key) for key in IDLE_SERVICES_OFF}
    os.environ.update(IDLE_SERVICES_OFF)  # the server process's environment, not this one's for long
    try:
        api, proc = start_server(tmp_path_factory.mktemp("prefect-server"), free_port())
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value
    os.environ[SHARED_PREFECT] = api
    yield api
    del os.environ[SHARED_PREFECT]
    stop(proc)
    if saved is not None:
        os.environ["PREFECT_API_URL"] = saved


def run_cli(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], cwd=workdir, env=cli_env(workdir), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def cli(workdir: Path, monkeypatch):
    """`rlhf ARGS` run in this process from `workdir` (what the subprocess runs, without the interpreter
    start and imports it pays each time): returns exit code, stdout and stderr like `run_cli`."""
    monkeypatch.chdir(workdir)
    for key in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PREFECT_API_URL", "PREFECT_HOME"):
        monkeypatch.delenv(key, raising=False)
    return main_in_process


def main_in_process(*args: str) -> subprocess.CompletedProcess:
    """`rlhf ARGS` run by the CLI's `main` in this process, from the current folder with the current
    environment, its stdout and stderr captured: what `run_cli` returns, without a new process's start."""
    import datasets
    from transformers.utils import logging as hf_logging

    from flows.cli.main import main

    # the CLI turns HF's progress bars off before transformers and datasets are imported; here they may be
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), prefect_console_on_stderr(), \
                prefect_api_from_environment():
            code = main(list(args))
    finally:
        hf_logging.enable_progress_bar()
        datasets.enable_progress_bars()
    return subprocess.CompletedProcess(["rlhf", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def as_a_cli_process(workdir: Path):
    """For the block, this process's folder and environment are what `run_cli` gives a new one (`cli_env`):
    for `main_in_process` where a function-scoped `cli` cannot serve (a module's fixture)."""
    saved = dict(os.environ)
    env = cli_env(workdir)  # read before the clear: built from this environment, as `run_cli`'s is
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.chdir(workdir):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def prefect_console_on_stderr():
    """Prefect's console handlers write to the stream that was sys.stderr when Prefect set up its logging: in
    this process, maybe an earlier test's capture, closed since. For one in-process CLI call they write to
    today's sys.stderr, which the test reads (a `rlhf run` process has one stderr all its life)."""
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger))]
    handlers = {h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)}
    saved = [(h, h.stream) for h in handlers]
    for h in handlers:  # not setStream, which flushes the old stream
        h.stream = h.console.file = sys.stderr
    try:
        yield
    finally:
        for h, stream in saved:
            h.stream = h.console.file = stream


@contextlib.contextmanager
def prefect_api_from_environment():
    """PREFECT_API_URL as the environment holds it now, as a `rlhf run` process would read it at its start:
    this process's Prefect read its settings when first imported, so a server set since (the tests' shared
    one) would be missed, and the run would start a temporary server of its own."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: os.environ.get("PREFECT_API_URL")}):
        yield


def cluster_processes(cli_pid: int) -> dict[psutil.Process, tuple[str, int]]:
    """Every process a CLI run started (its Ray cluster's daemons and workers): process -> (title, group)."""
    found = {}
    for p in psutil.Process(cli_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error, ProcessLookupError):  # a short-lived helper that is gone already
            found[p] = (" ".join(p.cmdline())[:60], os.getpgid(p.pid))
    return found


def assert_gone(processes, within_s: float) -> None:
    def alive():
        running = []
        for p, (title, _) in processes.items():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    running.append(title)
            except psutil.Error:
                pass
        return running

    deadline = time.monotonic() + within_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(), f"still running {within_s:g} s on: {alive()}"


def mlflow_client(workdir: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{workdir / '.rlhf' / 'mlflow.db'}")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def ray_head():
    """A cluster started with `ray start --head` (its own session, killed as a group afterwards): (port, process)."""
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    ray_bin = Path(sys.executable).parent / "ray"
    proc = subprocess.Popen([str(ray_bin), "start", "--head", "--block", "--num-cpus=2", f"--port={port}",
                             "--include-dashboard=false", f"--temp-dir={temp_dir}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("ray start --head did not open its port")
    yield port, proc
    os.killpg(proc.pid, signal.SIGKILL)  # the head and every Ray process it started share its session
    proc.wait(timeout=60)
    shutil.rmtree(temp_dir, ignore_errors=True)
