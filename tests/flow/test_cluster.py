"""`rlhf cluster up|down` on this machine: PostgreSQL, the MLflow server on it with its artifact proxy, a
2-node Ray cluster and a Prefect server + process worker, each checked through its own client; the tiny
pipeline as a flow run of the full deployment on the work pool runs every stage on the worker node with
every file through the MLflow server, then again all cached, and the server's UI shows the two runs in
headless Chromium; a node lost mid-SFT and an MLflow server restart are survived; `down` leaves no
process behind."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from artifacts import model_registry as registry
from artifacts import run_tags
from flows.cli import cluster
from flows.cli.serve import answers
from flows.services import cluster_secrets, processes
from stages.dag import declaration as dag
from tests.browser import mlflow_ui
from tests.flow.conftest import CLI, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a cluster, a browser install, two pipeline runs

# the tiny preset cut to a few steps a stage: what is checked is where the work and its files go
QUICK = [
    "data.synthetic.num_train=200", "data.synthetic.num_eval=21", "data.synthetic.num_prompts=20", "eval.max_samples=20",
    "sft.max_steps=6", "sft.eval_every=3", "sft.save_every=3", "rm.max_steps=4", "prm.max_steps=4",
    "rl.max_steps=2", "rl.rollout.batch_size=4", "rl.rollout.n_samples_per_prompt=4", "rl.train_batch_size=8",
    "rl.micro_train_batch_size=4", "rl.eval_every=2", "rl.save_every=1", "eval.samples_per_prompt=1",
    "dpo.max_steps=2", "dpo.micro_batch_size=4",
]


FLOW_RUN_PARAMETERS = """
import json
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as client:
    print(json.dumps([r.parameters for r in client.read_flow_runs()]))
"""

RAY_NODES = """
import json, sys
from flows.services.ray_cluster import use_local_token
use_local_token()
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
print(json.dumps([n["Resources"] for n in ray.nodes() if n["Alive"]]))
"""


@pytest.fixture
def root():
    """The cluster's folder, under /tmp: under root, PostgreSQL runs as its own user, which must reach it."""
    path = Path(tempfile.mkdtemp(prefix="rlhf-cluster-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(cluster.ray_temp_dir(path, "ray-head").parent, ignore_errors=True)


def stage_worker_logs(root: Path, node: str) -> list[Path]:
    logs = cluster.ray_temp_dir(root, node) / "session_latest" / "logs"
    return [p for p in logs.glob("worker-*.out") if "StageWorker" in p.read_text(errors="replace")]


def kill(root: Path, service: str, timeout: float = 30.0) -> None:
    """SIGKILL every process of a service `up` started, as a machine that died would leave it, and return once
    none is left: a process forked after a look at the table is killed at the next look, and a killed one
    that has not yet ended (still writing into the node's folder, still holding its port) is waited for."""
    leader = cluster.load(root).procs[service]
    deadline = time.monotonic() + timeout
    while alive := processes.family(processes.table(), leader):
        assert time.monotonic() < deadline, f"{service}: processes {sorted(alive)} still alive {timeout:.0f} s after SIGKILL"
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def restart(root: Path, service: str, command: list[str], env: dict[str, str]) -> None:
    """Start a service again as `up` did (recorded in the state file, so that `down` stops it)."""
    starter = cluster.Starter(cluster.load(root))
    starter.start(service, command, env)


def wait_for(what: str, found, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.5)
    return value


def survive_node_loss_and_server_restart(root: Path, workdir: Path, env: dict[str, str], client) -> None:
    """SFT on the worker node; once its first checkpoint is on the MLflow server the node dies (its folder
    with it) and a new one joins in its place: the stage is retried (`infra.node_wait_s`: it waits for the
    node), resumes on the new node from the server's checkpoint; the MLflow server restarts meanwhile
    and the uploads go on; one complete run and one new registered version come of it."""
    state = cluster.load(root)
    ports, u = state.ports, cluster.urls(state.ports)
    overrides = [cluster.PIN, *QUICK, "sft.max_steps=60", "sft.save_every=10", "sft.eval_every=60",
                 "infra.retry_delay_s=1", "infra.node_wait_s=180"]
    experiment = client.get_experiment_by_name("rlhf-pipeline").experiment_id
    versions = len(client.search_model_versions(f"name = '{registry.registered_name('sft_model')}'"))
    log = root / "prefect-worker" / "prefect-worker.log"
    flow_run = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "deployment", "run", "rlhf-pipeline/stage",
                                 "--watch", "-p", 'only=["sft"]', "-p", f"overrides={json.dumps(overrides)}"],
                                cwd=workdir, env=env | {"PREFECT_API_URL": u["prefect"]}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        def sft_runs():
            return client.search_runs([experiment], "tags.`rlhf.stage` = 'sft' and params.`sft.max_steps` = '60'",
                                      order_by=["attributes.start_time ASC"])

        def checkpointed():
            runs = sft_runs()
            return runs and any(a.path.endswith("/latest") for a in client.list_artifacts(runs[0].info.run_id, "work/checkpoints"))
        wait_for("checkpoint on the server", checkpointed)
        kill(root, "ray-worker")
        shutil.rmtree(root / "ray-worker" / "files")  # a new machine in the lost one's place
        # as `up` started it, presenting this machine's Ray token (set for the node alone: Ray in this
        # process keeps the auth mode it first read, and later tests start local clusters here)
        restart(root, "ray-worker", cluster.ray_worker_command(ports, cluster.ray_temp_dir(root, "ray-worker"), state.worker_cpus),
                cluster.ray_node_env(root) | {"RLHF_NODE_DIR": str(root / "ray-worker" / "files")})
        second = wait_for("rerun of sft", lambda: len(sft_runs()) > 1 and sft_runs()[1])
        kill(root, "mlflow")
        restart(root, "mlflow", cluster.mlflow_command(ports, root / "mlflow" / "artifacts"), cluster.mlflow_env(root))
        out, _ = flow_run.communicate(timeout=600)
    finally:
        if flow_run.poll() is None:
            flow_run.kill()
    text = log.read_text()
    assert flow_run.returncode == 0 and "Completed" in out, out[-3000:] + text[-5000:]
    first, *_ = runs = sft_runs()
    assert f"[sft] resuming from the checkpoints of MLflow run {first.info.run_id}" in text
    assert re.search(r"\[sft\] resumed from step (\d+)/60", text)
    assert [r.data.tags.get(run_tags.TAG_STATUS) for r in runs] == ["failed", run_tags.COMPLETE]
    assert runs[1].info.run_id == second.info.run_id
    new = client.search_model_versions(f"name = '{registry.registered_name('sft_model')}'")
    assert len(new) == versions + 1 and max(new, key=lambda v: int(v.version)).run_id == second.info.run_id


def refused(url: str, auth: str | None, body: bytes | None = None) -> int:
    """The HTTP status of a request with `auth` as its Authorization header (None: none)."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **({"Authorization": auth} if auth else {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def command_lines() -> list[str]:
    """Every process's command line, as `ps` shows them."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return lines


class CommandLineWatch:
    """Every process's command line, sampled twice a second while a block runs: what `ps` would have shown."""

    def __init__(self):
        self.seen: set[str] = set()
        self.done = threading.Event()

    def __enter__(self):
        def sample():
            while not self.done.wait(0.5):
                self.seen.update(command_lines())

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.done.set()
        self.thread.join(5)


def reward_server_refusals(cli_env: dict[str, str], rm_model: Path, token: str, workdir: Path) -> tuple[list[int], list[str]]:
    """`rlhf serve-rm` on the pipeline's reward model with a bearer token: the statuses of a request without a
    token, with a wrong one and with the right one; and the command lines while it served."""
    from stages.common.dist_env import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([*CLI, "serve-rm", "--model", str(rm_model), "--port", str(port)], cwd=workdir,
                              env=cli_env | {"RLHF_REWARD_TOKEN": token}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        def up() -> bool:
            with contextlib.suppress(OSError):
                return refused(f"{base}/health", f"Bearer {token}") == 200
            return False

        wait_for("the reward server", lambda: server.poll() is not None or up(), timeout=120)
        assert server.poll() is None, server.stdout.read()
        body = json.dumps({"query": ["<|user|>\nCompute 1+1\n<|assistant|>\n2"]}).encode()
        statuses = [refused(f"{base}/get_reward", auth, body) for auth in (None, "Bearer wrong-token", f"Bearer {token}")]
        return statuses, command_lines()
    finally:
        server.terminate()
        server.wait(30)


def test_cluster_up_serves_each_service_and_down_stops_every_process(tmp_path, root, monkeypatch):
    from mlflow import MlflowClient

    env = cli_env(tmp_path) | {"PREFECT_WORKER_QUERY_SECONDS": "1"}  # the worker picks a flow run up at once
    env.pop("PREFECT_API_URL", None)  # not the flow tests' shared server: the cluster has its own

    def rlhf(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "cluster", *args, "--dir", str(root)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    browser = mlflow_ui.install_chromium()  # alongside the cluster's start and flow runs
    timings = {}
    started = time.monotonic()
    up = rlhf("up", "--worker-cpus", "2")
    timings["up"] = time.monotonic() - started
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        state = cluster.load(root)
        assert set(state.procs) == set(cluster.SERVICES)
        rows = processes.table()
        pids = {pid for proc in state.procs.values() for pid in processes.family(rows, proc)}
        u = cluster.urls(state.ports)
        assert f"export RAY_ADDRESS={u['ray']} MLFLOW_TRACKING_URI={u['mlflow']} PREFECT_API_URL={u['prefect']}" in up.stdout
        assert f"set -a; . {root / cluster_secrets.CLIENT_ENV_FILE}; set +a" in up.stdout

        # every service asks for credentials, kept in the cluster folder for its owner only and shown nowhere
        made = cluster_secrets.ensure(root)
        secrets = [made.postgres_password, made.mlflow_password, made.mlflow_form_key, made.prefect_token, made.ray_token]
        for name in (cluster_secrets.SECRETS_FILE, cluster_secrets.CLIENT_ENV_FILE, cluster_secrets.RAY_TOKEN_FILE):
            assert (root / name).stat().st_mode & 0o077 == 0, name
        assert not [s for s in secrets if s in up.stdout + up.stderr]
        assert not [line for line in command_lines() if any(s in line for s in secrets)]
        search = f"{u['mlflow']}/api/2.0/mlflow/experiments/search?max_results=1"
        assert [refused(search, None), refused(search, basic(cluster_secrets.USER, "wrong-password"))] == [401, 401]
        flows = f"{u['prefect']}/flows/filter"
        assert [refused(flows, None, b"{}"), refused(flows, basic(cluster_secrets.USER, "wrong"), b"{}")] == [401, 401]
        assert refused(flows, basic(*made.prefect_auth_string.split(":", 1)), b"{}") == 200
        credentials = cluster.service_env(root, state.ports)
        env |= credentials
        for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):  # this process's client, the UI check's
            monkeypatch.setenv(key, credentials[key])

        status = rlhf("status")
        assert status.returncode == 0 and status.stdout.count(" up  pid ") == len(cluster.SERVICES), status.stdout

        # MLflow: a run through the REST API, an artifact up and down through the server's proxy
        client = MlflowClient(u["mlflow"])
        run = client.create_run(client.create_experiment("check"))
        client.log_text(run.info.run_id, "through the proxy", "note.txt")
        got = Path(client.download_artifacts(run.info.run_id, "note.txt", str(tmp_path)))
        assert got.read_text() == "through the proxy"
        assert client.get_run(run.info.run_id).info.artifact_uri.startswith("mlflow-artifacts:/")
        assert [p.read_text() for p in (root / "mlflow" / "artifacts").rglob("note.txt")] == ["through the proxy"]

        # PostgreSQL holds MLflow's tables
        import psycopg2

        with psycopg2.connect(u["postgres"].replace("+psycopg2", ""), password=made.postgres_password) as conn, conn.cursor() as cur:
            cur.execute("SELECT name FROM experiments ORDER BY experiment_id")
            assert cur.fetchall()[-1] == ("check",)

        # Ray: two live nodes, the worker with its resource (asked by a fresh driver: Ray reads its auth
        # mode when first imported, which in this process may have happened before)
        nodes = subprocess.run([sys.executable, "-c", RAY_NODES, u["ray"]], env=env, capture_output=True, text=True, timeout=120)
        assert nodes.returncode == 0, nodes.stderr[-3000:]
        nodes = json.loads(nodes.stdout.splitlines()[-1])
        assert len(nodes) == 2 and sorted(r.get(cluster.WORKER_RESOURCE, 0) for r in nodes) == [0, 2]

        # Prefect: the whole pipeline as a flow run of the full deployment, picked up by the pool's worker, every
        # stage on the worker node, every file through the MLflow server; then again, all cached
        assert answers(u["prefect"] + "/health") and cluster.worker_online(state.ports, state.pool, made.prefect_auth_string)
        watch = CommandLineWatch()
        for attempt in ("cold", "cached"):
            started = time.monotonic()
            with watch:
                flow_run = subprocess.run([str(Path(sys.executable).parent / "prefect"), "deployment", "run", "rlhf-pipeline/full",
                                           "--watch", "-p", f"overrides={json.dumps([cluster.PIN, *QUICK])}"],
                                          cwd=tmp_path, env=env | {"PREFECT_API_URL": u["prefect"]}, capture_output=True,
                                          text=True, timeout=900)
            timings[f"flow run, {attempt}"] = time.monotonic() - started
            worker_log = (root / "prefect-worker" / "prefect-worker.log").read_text()
            assert flow_run.returncode == 0 and "Completed" in flow_run.stdout, flow_run.stdout[-3000:] + worker_log[-5000:]
        assert "[rl] cached: reusing" in worker_log and "[eval] cached: reusing" in worker_log, worker_log[-5000:]
        assert stage_worker_logs(root, "ray-worker") and not stage_worker_logs(root, "ray-head")
        experiment = client.get_experiment_by_name("rlhf-pipeline")
        runs = client.search_runs([experiment.experiment_id], f"tags.`{run_tags.TAG_STATUS}` = '{run_tags.COMPLETE}'")
        assert {r.data.tags[run_tags.TAG_STAGE] for r in runs} == {"data_prep", "sft", "rm", "prm", "rl", "dpo", "eval"}
        assert all(r.info.artifact_uri.startswith("mlflow-artifacts:/") for r in runs)
        # no stage file on the driver's disk: the flow run downloaded the datasets (for their digests), nothing else
        state = tmp_path / ".rlhf"
        assert not list(state.glob("work/*/output")) and not list(state.glob("mlartifacts"))
        assert {p.name for p in state.glob("downloads/*/*")} <= set(dag.DATASETS)
        # the worker node fetched each model it read into its own folder, and cleared its work and outputs
        node = root / "ray-worker" / "files"
        assert {"base_model", "sft_model"} <= {p.name for p in node.glob("downloads/*/*")}
        assert not [p for p in node.glob("work/*") if p.is_dir()] and not any(node.glob("output/*"))
        for r in client.search_runs([experiment.experiment_id]):  # no secret in a param or tag of any run
            assert not [s for s in secrets for v in (*r.data.params.values(), *r.data.tags.values()) if s in v], r.info.run_id
        # nor on a command line while the pipeline ran, nor in the flow runs' Prefect parameters
        assert len(watch.seen) > 10 and not [line for line in watch.seen if any(s in line for s in secrets)]
        flow_runs = subprocess.run([sys.executable, "-c", FLOW_RUN_PARAMETERS], env=env | {"PREFECT_API_URL": u["prefect"]},
                                   capture_output=True, text=True, timeout=120)
        assert flow_runs.returncode == 0 and "overrides" in flow_runs.stdout, flow_runs.stderr[-2000:]
        assert not [s for s in secrets if s in flow_runs.stdout]
        # the reward server asks for its bearer token (never a flag: not on its command line)
        rm = next(r for r in runs if r.data.tags[run_tags.TAG_STAGE] == "rm")
        rm_model = Path(client.download_artifacts(rm.info.run_id, "reward_model", str(tmp_path / "rm")))
        token = "reward-" + made.ray_token[:20]
        statuses, lines = reward_server_refusals(env, rm_model, token, tmp_path)
        assert statuses == [401, 401, 200] and not [line for line in lines if token in line]
        # a deployment run that would choose code is refused with one line before anything runs
        before = len(client.search_runs([experiment.experiment_id]))
        code = subprocess.run([str(Path(sys.executable).parent / "prefect"), "deployment", "run", "rlhf-pipeline/full",
                               "--watch", "-p", f"overrides={json.dumps([cluster.PIN, 'model.trust_remote_code=true'])}"],
                              cwd=tmp_path, env=env | {"PREFECT_API_URL": u["prefect"]}, capture_output=True, text=True,
                              timeout=300)
        worker_log = (root / "prefect-worker" / "prefect-worker.log").read_text()
        assert code.returncode != 0 and "model.trust_remote_code" in worker_log, code.stdout[-2000:] + worker_log[-3000:]
        assert len(client.search_runs([experiment.experiment_id])) <= before + 1  # at most the refused pipeline run
        rl = next(r for r in runs if r.data.tags[run_tags.TAG_STAGE] == "rl")
        assert {"train/reward", "eval/accuracy"} <= set(rl.data.metrics)
        assert client.get_model_version(registry.registered_name("rl_model"), "1").source.startswith("mlflow-artifacts:/")

        # the server's own UI in headless Chromium: the views a user compares these runs in
        started = time.monotonic()
        if browser is not None:
            installed = browser.communicate(timeout=600)[0]
            assert browser.returncode == 0, f"apt-get install chromium failed: {installed[-2000:]}"
        ui = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "browser" / "mlflow_ui.py"), u["mlflow"],
                             str(tmp_path / "ui")], capture_output=True, text=True, timeout=600)
        timings["browser"] = time.monotonic() - started
        assert ui.returncode == 0, ui.stdout[-3000:] + ui.stderr[-3000:]

        started = time.monotonic()
        survive_node_loss_and_server_restart(root, tmp_path, env, client)
        timings["faults"] = time.monotonic() - started
    finally:
        if browser is not None and browser.poll() is None:
            browser.communicate(timeout=600)  # an install stopped halfway would leave dpkg broken: let it end
        started = time.monotonic()
        down = rlhf("down")
        timings["down"] = time.monotonic() - started
        print(json.dumps({k: round(v, 1) for k, v in timings.items()}))
    assert down.returncode == 0, down.stderr
    rows = processes.table()
    assert not [pid for pid in pids if pid in rows and rows[pid].state != "Z"]
    assert not (root / cluster.STATE_FILE).exists() and (root / "postgres" / "data" / "PG_VERSION").is_file()
    assert rlhf("status").returncode == 1
