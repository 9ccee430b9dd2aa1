"""Runs left RUNNING by a process that died are closed FAILED by the next start; no other run is."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from mlflow.entities import RunStatus

from artifacts import run_owner, run_tags

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

CREATE_AND_HANG = textwrap.dedent("""
    import sys, time
    from mlflow import MlflowClient
    from artifacts import run_owner
    run = MlflowClient().create_run(sys.argv[1], tags=run_owner.owner_tags())
    print(run.info.run_id, flush=True)
    time.sleep(600)
""")


def killed_owners_run(client) -> tuple[str, int]:
    """A run created by a process (with the pipeline's owner tags) that is then SIGKILLed: (run id, pid)."""
    proc = subprocess.Popen([sys.executable, "-c", CREATE_AND_HANG, client.exp], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        run_id = proc.stdout.readline().strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    return run_id, proc.pid


def test_the_run_of_a_killed_process_is_closed_failed_with_why(client):
    run_id, pid = killed_owners_run(client)
    assert client.get_run(run_id).info.status == "RUNNING"
    assert run_owner.close_orphans(client, client.exp) == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags[run_tags.TAG_STATUS] == "failed"
    assert run.data.tags["rlhf.error"] == f"the process that ran it ended without closing it (pid {pid} on {socket.gethostname()})"
    assert run_owner.close_orphans(client, client.exp) == []


def test_runs_whose_owner_may_be_alive_are_left_alone(client):
    host = socket.gethostname()
    mine = client.create_run(client.exp, tags=run_owner.owner_tags()).info.run_id
    remote = client.create_run(client.exp, tags={run_owner.TAG_OWNER: "another-host 1 1.0"}).info.run_id
    untagged = client.create_run(client.exp).info.run_id  # made before owners were recorded: nothing proves it dead
    finished = client.create_run(client.exp, tags={run_owner.TAG_OWNER: f"{host} 1 1.0"}).info.run_id
    client.set_terminated(finished, RunStatus.to_string(RunStatus.FINISHED))
    assert run_owner.close_orphans(client, client.exp) == []
    assert [client.get_run(r).info.status for r in (mine, remote, untagged, finished)] == ["RUNNING"] * 3 + ["FINISHED"]


def test_an_owner_is_gone_when_its_pid_is_free_or_another_process():
    host = socket.gethostname()
    me = run_owner.owner_tags()[run_owner.TAG_OWNER]
    _, pid, started = me.split(" ")
    assert not run_owner.gone(me)
    assert run_owner.gone(f"{host} {pid} {float(started) - 3600:.3f}")  # the pid reused since
    assert not run_owner.gone(f"another-host {pid} {float(started) - 3600:.3f}")  # there: no telling
    assert not run_owner.gone("a tag in some other format")
    child = subprocess.Popen(["true"])
    owner = f"{host} {child.pid} {psutil.Process(child.pid).create_time():.3f}"
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not yet reaped
        time.sleep(0.01)
    assert run_owner.gone(owner)
    child.wait()
    assert run_owner.gone(owner)
