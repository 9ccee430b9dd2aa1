"""Which process must close an MLflow run, and closing the runs whose process died with them open.

A pipeline or stage run records its owner (`rlhf.owner`: host, pid, process start time) when it is
created. A process killed outright (SIGKILL, the OOM killer, a full disk that also stops it from
writing its end) leaves its runs RUNNING; the next `rlhf run` or `rlhf runs` on the store marks
them FAILED, but only where the owner is provably gone: on this host, and no process with that pid
and start time alive. A run owned on another host (a remote worker, a deployment served elsewhere)
is left alone: from here there is no telling whether its process still runs.
"""

from __future__ import annotations

import socket

import psutil
from mlflow import MlflowClient

from artifacts import store

TAG_OWNER = "rlhf.owner"
SAME_START_S = 1.0  # a pid reused by a process started within a second of the owner is not worth guarding


def owner_tags() -> dict[str, str]:
    """The tags that name this process as the owner of a run it creates."""
    me = psutil.Process()
    return {TAG_OWNER: f"{socket.gethostname()} {me.pid} {me.create_time():.3f}"}


def gone(owner: str) -> bool:
    """The owner ran on this host and is no longer alive (its pid is free, a zombie, or another process's)."""
    try:
        host, pid_text, started_text = owner.rsplit(" ", 2)
        pid, started = int(pid_text), float(started_text)
    except ValueError:  # not our format
        return False
    if host != socket.gethostname():
        return False
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) > SAME_START_S or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # alive, but not ours to inspect
        return False


def close_orphans(client: MlflowClient, experiment_id: str) -> list[str]:
    """Mark FAILED the RUNNING runs of this experiment whose owner is gone; returns their ids (a store
    that cannot be written now, a full disk, keeps them RUNNING for a later start to close)."""
    host = socket.gethostname()
    running = client.search_runs(
        [experiment_id], f"attributes.status = 'RUNNING' and tags.`{TAG_OWNER}` LIKE '{host} %'", max_results=1000
    )
    closed = []
    for run in running:
        owner = run.data.tags[TAG_OWNER]
        if gone(owner):
            pid = owner.split(" ")[-2]
            if store.try_mark_failed(client, run.info.run_id,
                                     f"the process that ran it ended without closing it (pid {pid} on {host})"):
                closed.append(run.info.run_id)
    return closed
