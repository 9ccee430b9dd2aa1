"""`rlhf cluster`: the command lines it starts the services with, its state file, what it prints, and how
it finds and stops the processes it started (real processes, no services)."""

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from configs import PipelineError
from flows.cli import cluster
from flows.cli.cluster import Cluster
from flows.services import processes
from flows.services.processes import Proc, Row

PORTS = {"postgres": 5001, "mlflow": 5002, "ray": 5003, "prefect": 5004}


def test_the_mlflow_server_stores_runs_in_postgres_and_serves_the_artifacts(tmp_path):
    command = cluster.mlflow_command(PORTS, tmp_path / "artifacts")
    assert command[:4] == [sys.executable, "-m", "mlflow", "server"]
    given = dict(itertools.pairwise(command))
    assert given["--backend-store-uri"] == "postgresql+psycopg2://rlhf@127.0.0.1:5001/mlflow"
    assert given["--artifacts-destination"] == str(tmp_path / "artifacts")
    assert "--serve-artifacts" in command and given["--host"] == "127.0.0.1" and given["--port"] == "5002"
    assert given["--app-name"] == "basic-auth"  # a login for every request but the health probe


def test_postgres_listens_on_loopback_only(tmp_path):
    command = cluster.postgres_command(tmp_path, tmp_path / "data", 5001)
    assert command[0] == str(tmp_path / "postgres")
    assert "listen_addresses=127.0.0.1" in command and "unix_socket_directories=" in command
    initdb = cluster.initdb_command(tmp_path, tmp_path / "data", tmp_path / "pw")
    assert initdb[:3] == [str(tmp_path / "initdb"), "-D", str(tmp_path / "data")]
    # a password from a file even on loopback, never on the command line
    assert "--auth=scram-sha-256" in initdb and f"--pwfile={tmp_path / 'pw'}" in initdb


def test_the_ray_nodes_have_folders_of_their_own_and_the_worker_advertises_its_resource(tmp_path):
    root = tmp_path / "c"
    head_temp, worker_temp = cluster.ray_temp_dir(root, "ray-head"), cluster.ray_temp_dir(root, "ray-worker")
    assert head_temp != worker_temp and head_temp.parent == worker_temp.parent
    assert len(str(head_temp)) < 50  # Ray's socket paths inside it (about 60 more bytes) must fit in 107
    assert cluster.ray_temp_dir(tmp_path / "other", "ray-head") != head_temp
    head = cluster.ray_head_command(PORTS, head_temp, 2)
    worker = cluster.ray_worker_command(PORTS, worker_temp, 2)
    assert "--head" in head and "--port=5003" in head and f"--temp-dir={head_temp}" in head and "--block" in head
    assert "--address=127.0.0.1:5003" in worker and f"--temp-dir={worker_temp}" in worker and "--block" in worker
    assert '--resources={"worker_node": 2}' in worker and "--num-cpus=2" in worker
    assert not any(arg.startswith("--resources") for arg in head)
    assert '--system-config={"worker_niceness": 0}' in head  # every node's workers, as on the local cluster


def test_the_prefect_worker_serves_the_pool_and_reaches_every_service():
    assert cluster.prefect_worker_command("mine")[-4:] == ["--pool", "mine", "--type", "process"]
    assert cluster.client_env(PORTS) == {"RAY_ADDRESS": "127.0.0.1:5003", "MLFLOW_TRACKING_URI": "http://127.0.0.1:5002",
                                         "PREFECT_API_URL": "http://127.0.0.1:5004/api"}


def test_down_stops_every_service_once_clients_before_their_servers():
    clients, servers = cluster.STOP_WAVES
    assert sorted(clients + servers) == sorted(cluster.SERVICES)
    assert {"prefect-worker", "ray-worker", "mlflow"} == set(clients)


def test_the_state_file_round_trips(tmp_path):
    state = Cluster(tmp_path, "rlhf", 2, PORTS, {"postgres": Proc(11, 22), "mlflow": Proc(33, 44)})
    state.save()
    assert cluster.load(tmp_path) == state
    assert cluster.load(tmp_path / "nothing") is None


def test_up_prints_the_addresses_and_the_commands_that_use_them(tmp_path):
    text = cluster.usage(Cluster(tmp_path, "rlhf", 2, PORTS))
    assert "export RAY_ADDRESS=127.0.0.1:5003 MLFLOW_TRACKING_URI=http://127.0.0.1:5002 PREFECT_API_URL=http://127.0.0.1:5004/api" in text
    assert "  rlhf run 'infra.worker_resources={worker_node: 1}'" in text
    assert "  PREFECT_API_URL=http://127.0.0.1:5004/api prefect deployment run rlhf-pipeline/full --watch\n" in text
    assert f"rlhf cluster down --dir {tmp_path}" in text
    assert cluster.PIN == "infra.worker_resources={worker_node: 1}"


def test_status_and_down_without_a_cluster_are_one_line(tmp_path):
    healthy, text = cluster.status(tmp_path)
    assert not healthy and text == f"no cluster was started in {tmp_path} (no cluster.json); start one: rlhf cluster up --dir {tmp_path}"
    with pytest.raises(PipelineError, match=r"^no cluster was started in .* nothing to stop$"):
        cluster.down(tmp_path)


def test_up_refuses_while_the_last_one_is_still_up(tmp_path):
    me = Proc(os.getpid(), processes.table()[os.getpid()].started)
    Cluster(tmp_path, "rlhf", 2, PORTS, {"mlflow": me, "postgres": Proc(me.pid, me.started - 1)}).save()
    with pytest.raises(PipelineError, match=r"^a cluster started here is still up \(mlflow; .*cluster down --dir"):
        cluster.up(tmp_path, "rlhf", 2)


def test_no_postgres_is_one_line_naming_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no initdb, no pg_config
    monkeypatch.setattr(cluster.glob, "glob", lambda pattern: [])
    with pytest.raises(PipelineError, match=r"^PostgreSQL not found: no initdb and postgres on PATH, .*apt-get install postgresql"):
        cluster.postgres_bindir()


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL changes user only under root")
def test_postgres_run_as_another_user_must_be_able_to_enter_the_folder():
    closed = Path(tempfile.mkdtemp(dir="/tmp"))  # 0700, under /tmp (1777)
    try:
        with pytest.raises(PipelineError, match=f"user 'nobody' here, who cannot enter {closed}; .*chmod o\\+x {closed}\\)$"):
            cluster.check_enterable(closed / "cluster", "nobody")
        closed.chmod(0o711)
        cluster.check_enterable(closed / "cluster", "nobody")
        (closed / "cluster").mkdir(mode=0o700)
        with pytest.raises(PipelineError, match=f"cannot enter {closed / 'cluster'};"):
            cluster.check_enterable(closed / "cluster", "nobody")
    finally:
        shutil.rmtree(closed)


def test_a_stat_line_is_read_whatever_the_command_name_holds():
    line = "42 (a) b (c)) S 7 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 9876 0 0"
    assert processes.parse_stat(line) == Row(ppid=7, session=42, state="S", started=9876)


def test_a_service_is_its_session_and_every_descendant_but_no_older_process_and_no_zombie():
    rows = {
        10: Row(1, 10, "S", 100),  # the leader
        11: Row(10, 10, "S", 101),  # in its session
        12: Row(11, 12, "S", 102),  # left the session (setsid), still its descendant
        13: Row(12, 13, "S", 103),  # and that one's child
        14: Row(11, 10, "Z", 104),  # ended, not yet reaped
        20: Row(1, 10, "S", 50),  # an older process in a session whose leader's pid was reused
        21: Row(1, 21, "S", 105),  # someone else's
    }
    assert processes.family(rows, Proc(10, 100)) == {10, 11, 12, 13}
    del rows[10]  # a leader that ended leaves its session's processes behind
    assert processes.family(rows, Proc(10, 100)) == {11, 12, 13}


def test_stop_ends_every_process_a_leader_started_even_one_that_left_its_session(tmp_path):
    """The leader ignores SIGTERM and its child moved to a session of its own: SIGKILL after the grace."""
    script = "trap '' TERM; setsid sleep 300 & sleep 300 & wait"
    popen = processes.spawn(["bash", "-c", script], tmp_path / "log", tmp_path, dict(os.environ))
    leader = processes.proc_of(popen)
    deadline = time.monotonic() + 10
    while len(processes.family(processes.table(), leader)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = processes.family(processes.table(), leader)
    assert len(started) == 3
    assert processes.stop([(leader, signal.SIGTERM, True)], grace_s=0.5) == set()
    popen.wait(timeout=5)
    rows = processes.table()
    assert not any(pid in rows and rows[pid].state != "Z" for pid in started)


def test_a_program_run_as_another_user_gets_only_that_users_groups():
    if os.geteuid() != 0:
        assert processes.as_user(None) == {}
        return
    out = subprocess.run(["id", "-G"], capture_output=True, text=True, check=True, **processes.as_user("nobody")).stdout
    assert "0" not in out.split()


def test_a_database_made_without_passwords_is_refused(tmp_path):
    data = tmp_path / "postgres" / "data"
    data.mkdir(parents=True)
    (data / "pg_hba.conf").write_text("# TYPE DATABASE USER ADDRESS METHOD\nhost all all 127.0.0.1/32 scram-sha-256\n")
    cluster.check_password_auth(data)
    (data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    with pytest.raises(PipelineError, match=r"pg_hba.conf: made by an earlier `rlhf cluster up` without passwords "
                                            r"\(trust\); remove the cluster folder's postgres/ and mlflow/"):
        cluster.check_password_auth(data)
