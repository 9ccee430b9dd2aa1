"""`rlhf serve`: the pipeline's deployments, served from this process, plus what they need.

Brings up what is missing, on loopback: a Prefect server (the one at PREFECT_API_URL when it
answers, else one started here with its SQLite DB under the state folder), an MLflow UI on the
pipeline's store, and serves two deployments of the `rlhf-pipeline` flow:

- `rlhf-pipeline/full`: the whole DAG (parameters `config`, `overrides`, `force`, `only`)
- `rlhf-pipeline/stage`: the stages named by `only`, their inputs reused from MLflow

Stopping it (Ctrl-C or SIGTERM) stops the servers it started, and only those. The same two
deployments can instead be registered on a work pool (`register_deployments`, for `rlhf cluster up`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from configs.errors import PipelineError
from flows.services import prefect_db
from flows.services.tied import tied_to

START_TIMEOUT_S = 120


# name -> (default parameters besides `config`, description); prefect.yaml declares the same two for work pools
DEPLOYMENTS = {
    "full": ({}, "The whole DAG; stages whose fingerprint is unchanged are reused from MLflow."),
    "stage": ({"only": ["eval"]}, "Just the stages in `only` (default eval); the stages they need are reused from MLflow."),
}


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class Starting:
    """A server process started, perhaps not answering yet."""

    proc: subprocess.Popen
    health_url: str
    what: str
    log: Path

    def ready(self) -> subprocess.Popen:
        """Wait until it answers; stopped (SIGTERM, Ctrl-C) or failed meanwhile, nothing is left running."""
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise PipelineError(f"{self.what} exited with code {self.proc.returncode} while starting; see {self.log}")
                if answers(self.health_url):
                    return self.proc
                time.sleep(0.5)
        except BaseException:
            stop(self.proc)
            raise
        stop(self.proc)
        raise PipelineError(f"{self.what} did not answer at {self.health_url} within {START_TIMEOUT_S} s; see {self.log}")


def launch(command: list[str], health_url: str, what: str, log: Path, env: dict | None = None) -> Starting:
    """Start a server in its own session (so stopping it stops its children), without waiting for it; it ends
    with this process however this process ends (a SIGKILL too)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})}, preexec_fn=tied_to(os.getpid()))
    return Starting(proc, health_url, what, log)


def start(command: list[str], health_url: str, what: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start a server and wait until it answers."""
    return launch(command, health_url, what, log, env).ready()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def prefect_server(state_dir: Path, port: int) -> tuple[str, subprocess.Popen | None]:
    """The API URL of a Prefect server that answers: PREFECT_API_URL's, else one started here."""
    given = os.environ.get("PREFECT_API_URL")
    if given and answers(given.rstrip("/") + "/health"):
        return given, None
    if given:
        raise PipelineError(f"PREFECT_API_URL={given}: no Prefect server answers there; unset it to start one here")
    api = f"http://127.0.0.1:{port}/api"
    if answers(api + "/health"):
        raise PipelineError(f"port {port} already has a Prefect server: set PREFECT_API_URL={api} to use it, or pick --prefect-port")
    home = state_dir / "prefect"
    keep_template = prefect_db.seeded(home)  # a new database: a copy of an empty migrated one
    proc = start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                 api + "/health", "the Prefect server", state_dir / "logs" / "prefect-server.log", {"PREFECT_HOME": str(home)})
    keep_template()
    return api, proc


BACKEND_URI_ENV = "MLFLOW_BACKEND_STORE_URI"  # `mlflow ui`/`server`'s --backend-store-uri, kept off the command line


def mlflow_ui_command(port: int) -> list[str]:
    """`mlflow ui` on 127.0.0.1:`port`; its store comes from the environment (`BACKEND_URI_ENV`), so a password
    in the URI is not on a command line every user of the machine can read."""
    return [sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(port)]


def mlflow_ui(uri: str, state_dir: Path, port: int) -> Starting:
    """The MLflow UI on the store at `uri`, started (`.ready()` waits until it answers)."""
    url = f"http://127.0.0.1:{port}"
    if answers(url + "/health"):
        raise PipelineError(f"port {port} is taken (something answers at {url}); pick --mlflow-port")
    return launch(mlflow_ui_command(port), url + "/health", "the MLflow UI", state_dir / "logs" / "mlflow-ui.log",
                  {BACKEND_URI_ENV: uri})


def terminated(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def serve(config: str | None, prefect_port: int, mlflow_port: int | None) -> None:
    from artifacts import tracking
    from configs import load_config

    setup = tracking.resolve(load_config(config).tracking)
    started: list[subprocess.Popen] = []
    # a SIGTERM before the runner takes it over (while the servers start, the deployments register) ends
    # the serve through `finally`, not at once with its servers left running
    signal.signal(signal.SIGTERM, terminated)
    try:  # the two servers start side by side
        ui = mlflow_ui(setup.uri, setup.state_dir, mlflow_port) if mlflow_port else None
        started += [ui.proc] if ui else []
        api, proc = prefect_server(setup.state_dir, prefect_port)
        started += [proc] if proc else []
        os.environ["PREFECT_API_URL"] = api  # for the runner below and the flow runs it starts
        if ui:
            ui.ready()
        serve_deployments(config or "tiny", api, mlflow_port)
    finally:
        for proc in reversed(started):
            stop(proc)


def register_deployments(api: str, pool: str, overrides: list[str], working_dir: Path, config: str = "tiny") -> None:
    """The two deployments on work pool `pool` (what `prefect deploy` makes of prefect.yaml): its workers
    import the flow by module name and run it in `working_dir`, where a relative state folder or data path
    means what it means to `rlhf run` there. `overrides`: their default, e.g. the cluster's worker pin."""
    from prefect.deployments.runner import EntrypointType, RunnerDeployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.pipeline import rlhf_pipeline

    with temporary_settings({PREFECT_API_URL: api}):
        for name, (params, description) in DEPLOYMENTS.items():
            # called outside an event loop, to_deployment returns the deployment, not a coroutine
            deployment = cast(RunnerDeployment, rlhf_pipeline.to_deployment(
                name=name, description=description, entrypoint_type=EntrypointType.MODULE_PATH,
                parameters={"config": config, **params, "overrides": overrides}, job_variables={"working_dir": str(working_dir)},
            ))
            deployment.apply(work_pool_name=pool)


def serve_deployments(config: str, api: str, mlflow_port: int | None) -> None:
    """Register the deployments, then say how to run them, then serve them (as `prefect.serve`, with the
    lines below printed only once `prefect deployment run` can find what they name)."""
    import asyncio

    from prefect.deployments.runner import RunnerDeployment
    from prefect.exceptions import TerminationSignal
    from prefect.runner import Runner

    from flows.pipeline import FLOW_NAME, rlhf_pipeline

    runner = Runner(pause_on_shutdown=True)
    for name, (params, description) in DEPLOYMENTS.items():
        # called outside an event loop (asyncio.run comes below), to_deployment returns the deployment itself
        runner.add_deployment(cast(RunnerDeployment, rlhf_pipeline.to_deployment(
            name=name, parameters={"config": config, **params}, description=description)))
    ui = api.removesuffix("/api")
    print(f"Prefect UI:  {ui}", flush=True)
    if mlflow_port:
        print(f"MLflow UI:   http://127.0.0.1:{mlflow_port}", flush=True)
    print(f"Run, from another shell (PREFECT_API_URL={api}):\n"
          f"  prefect deployment run {FLOW_NAME}/full --watch\n"
          f"  prefect deployment run {FLOW_NAME}/full --watch -p overrides='[\"sft.lr=3e-4\"]' -p force='[\"rm\"]'\n"
          f"  prefect deployment run {FLOW_NAME}/stage --watch -p only='[\"rm\"]'", flush=True)
    with contextlib.suppress(KeyboardInterrupt, TerminationSignal):  # the serve's own stop: its caller shuts the servers down
        asyncio.run(runner.start())
