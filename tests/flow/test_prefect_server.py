"""Prefect's temporary server as `rlhf run` starts it (flows/services/prefect_server.py): a signal to the run's process
group does not reach it, and it does not outlive the run. prefect.yaml registers the two deployments on a
work pool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.flow.conftest import cli_env

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")

# a stand-in for the CLI: starts the server, then ignores SIGTERM as `rlhf run` stops in order for it
STARTER = """
import signal, time
from flows.services import prefect_db
from flows.services.prefect_server import SessionServer
prefect_db.seeded()  # as `rlhf run` starts it: its database a copy of an empty migrated one, when there is one
server = SessionServer()
server.start()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(server.server_process.pid, server.api_url, flush=True)
time.sleep(600)
"""


def test_the_server_outlives_a_sigterm_to_the_runs_group_and_stops_when_the_run_is_killed(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path), PYTHONPATH=str(ROOT), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    starter = subprocess.Popen([sys.executable, "-c", STARTER], env=env, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        pid, api = starter.stdout.readline().split()
        server = psutil.Process(int(pid))
        assert os.getsid(server.pid) != os.getsid(starter.pid)

        os.killpg(starter.pid, signal.SIGTERM)  # what `timeout` or systemd's stop sends
        time.sleep(1.0)
        assert httpx.get(f"{api}/health", timeout=10).status_code == 200  # still serving the stopping run

        os.killpg(starter.pid, signal.SIGKILL)  # the run killed: nothing stops the server but itself
        starter.wait(timeout=10)
        server.wait(timeout=10)  # gone, not left running for ever
    finally:
        starter.kill()
        starter.wait()


def test_prefect_yaml_registers_both_deployments_on_the_work_pool(prefect_server, tmp_path):
    """prefect.yaml's commands, as its header gives them: the same two deployments `rlhf serve` serves,
    registered on the `rlhf` work pool for `prefect worker start --pool rlhf`, run from this folder."""
    env = cli_env(tmp_path) | {"PREFECT_API_URL": prefect_server}
    for command in (["work-pool", "create", "rlhf", "--type", "process", "--overwrite"], ["deploy", "--all"]):
        done = subprocess.run([PREFECT, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with temporary_settings({PREFECT_API_URL: prefect_server}), get_client(sync_client=True) as client:
        for name in ("full", "stage"):
            deployment = client.read_deployment_by_name(f"rlhf-pipeline/{name}")
            assert deployment.work_pool_name == "rlhf", deployment
            assert str(ROOT) in str(deployment.pull_steps), deployment.pull_steps
