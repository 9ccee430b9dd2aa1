"""`rlhf cluster up|down|status`: the services of a multi-machine setup, started on this machine.

- PostgreSQL (a fresh data folder, database `mlflow`), and an MLflow tracking server on it that serves
  the artifacts too (`--serve-artifacts`: clients up- and download through the server);
- a Ray head node and one worker node (`ray start`), the worker advertising `worker_node`, so that
  `infra.worker_resources='{worker_node: 1}'` pins every stage worker to it;
- a Prefect server and a process worker on work pool `rlhf`, which runs the pipeline's deployments.

Each service has a folder of its own under the cluster folder (default `.rlhf/cluster`), holding its log
and data; `cluster.json` there records the processes and ports. `down` stops exactly those processes and
keeps the data, which the next `up` reuses.

Every service asks for credentials, made with the folder (flows/services/cluster_secrets.py): PostgreSQL a
password (scram-sha-256), the MLflow server a basic-auth login (MLflow's `basic-auth` app), Prefect's API
its auth string, Ray's nodes and drivers the cluster's token. They bind 127.0.0.1 all the same.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import glob
import hashlib
import importlib
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from artifacts.private_dirs import private_dir
from configs.errors import PipelineError
from flows.cli.serve import answers
from flows.services import cluster_secrets, prefect_db, processes
from flows.services.cluster_secrets import ClusterSecrets
from flows.services.processes import Proc

STATE_FILE = "cluster.json"
SERVICES = ("postgres", "mlflow", "ray-head", "ray-worker", "prefect-server", "prefect-worker")  # in start order
PORTS = ("postgres", "mlflow", "ray", "prefect")
DB_USER, DB_NAME = "rlhf", "mlflow"
WORKER_RESOURCE = "worker_node"
PIN = f"infra.worker_resources={{{WORKER_RESOURCE}: 1}}"  # the override that sends stage work to the worker node
RAY_SYSTEM_CONFIG = {"worker_niceness": 0}
RAY_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}  # a stopped node waits for no work to leave first
# no server-side jobs (GenAI judges, trace roll-ups): the pipeline runs none, and each of their consumer
# processes would import MLflow while the cluster starts
MLFLOW_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
START_TIMEOUT_S = 120.0  # per service, on a busy machine
STOP_GRACE_S = 10.0
POSTGRES_BINARIES = ("initdb", "postgres")


@dataclasses.dataclass
class Cluster:
    """What `up` started, as the state file records it."""

    root: Path
    pool: str
    worker_cpus: int
    ports: dict[str, int]
    procs: dict[str, Proc] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"pool": self.pool, "worker_cpus": self.worker_cpus, "ports": self.ports,
                           "processes": {name: dataclasses.asdict(p) for name, p in self.procs.items()}}, indent=1)

    @classmethod
    def from_json(cls, root: Path, text: str) -> Cluster:
        data = json.loads(text)
        return cls(root, data["pool"], data["worker_cpus"], data["ports"],
                   {name: Proc(**p) for name, p in data["processes"].items()})

    def save(self) -> None:
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(self.root / STATE_FILE)


def urls(ports: dict[str, int]) -> dict[str, str]:
    return {
        "postgres": f"postgresql+psycopg2://{DB_USER}@127.0.0.1:{ports['postgres']}/{DB_NAME}",
        "mlflow": f"http://127.0.0.1:{ports['mlflow']}",
        "ray": f"127.0.0.1:{ports['ray']}",
        "prefect": f"http://127.0.0.1:{ports['prefect']}/api",
    }


def client_env(ports: dict[str, int]) -> dict[str, str]:
    """What a client of these services sets: the pipeline, the Prefect worker and its flow runs."""
    u = urls(ports)
    return {"RAY_ADDRESS": u["ray"], "MLFLOW_TRACKING_URI": u["mlflow"], "PREFECT_API_URL": u["prefect"]}


def service_env(root: Path, ports: dict[str, int]) -> dict[str, str]:
    """Addresses and credentials: what the Prefect worker, its flow runs and a user's shell set (`client.env`)."""
    return client_env(ports) | cluster_secrets.credentials_env(root, cluster_secrets.ensure(root))


def usage(cluster: Cluster) -> str:
    """The services' addresses and the commands that use them, as `up` and `status` print them (no secret:
    the credentials are in the cluster folder's `client.env`, which only its owner reads)."""
    u, env = urls(cluster.ports), client_env(cluster.ports)
    exports = " ".join(f"{k}={v}" for k, v in env.items())
    credentials = cluster.root / cluster_secrets.CLIENT_ENV_FILE
    return "\n".join([
        f"PostgreSQL:   {u['postgres']}",
        f"MLflow:       {u['mlflow']}  (artifacts: {cluster.root / 'mlflow' / 'artifacts'}, served by the server)",
        f"Ray:          {u['ray']}  (head + worker node; the worker has the resource {WORKER_RESOURCE})",
        f"Prefect:      {u['prefect'].removesuffix('/api')}  (work pool {cluster.pool}, one process worker)",
        f"Each asks for credentials (MLflow user {cluster_secrets.USER}, Prefect's auth string, Ray's token): they are in "
        f"{credentials}, readable by you only.",
        "Run the pipeline here, on these services:",
        f"  export {exports}",
        f"  set -a; . {credentials}; set +a",
        f"  rlhf run '{PIN}'",
        "or as a flow run on the work pool (its deployments pin the worker node):",
        f"  PREFECT_API_URL={u['prefect']} prefect deployment run rlhf-pipeline/full --watch",
        f"  PREFECT_API_URL={u['prefect']} prefect deployment run rlhf-pipeline/full --watch "
        f"-p overrides='[\"{PIN}\", \"sft.lr=3e-4\"]'",
        f"Stop them: rlhf cluster down --dir {cluster.root}",
    ])


# --- commands ---------------------------------------------------------------------------------------------


def initdb_command(bindir: Path, data: Path, password_file: Path) -> list[str]:
    # a password even on loopback: every local user can reach 127.0.0.1
    return [str(bindir / "initdb"), "-D", str(data), "-U", DB_USER, "--auth=scram-sha-256", f"--pwfile={password_file}",
            "--encoding=UTF8", "--no-instructions"]


def postgres_command(bindir: Path, data: Path, port: int) -> list[str]:
    # TCP on loopback only; no Unix socket (its default folder may not exist, or be another server's)
    return [str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1",
            "-c", "unix_socket_directories="]


def mlflow_command(ports: dict[str, int], artifacts: Path) -> list[str]:
    # the database's password comes through the environment (PGPASSWORD), not the URI on this command line
    return [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--backend-store-uri", urls(ports)["postgres"],
            "--serve-artifacts", "--artifacts-destination", str(artifacts),
            "--host", "127.0.0.1", "--port", str(ports["mlflow"]), "--workers", "1"]


def mlflow_env(root: Path) -> dict[str, str]:
    """The MLflow server's environment: its auth app's config (users in a SQLite file beside the artifacts,
    no access without a login), the admin's password, the forms' key, the database's password."""
    made = cluster_secrets.ensure(root)
    folder = root / "mlflow"
    config = folder / "basic_auth.ini"
    cluster_secrets.write_private(config, "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
                                          f"database_uri = sqlite:///{folder / 'basic_auth.db'}\n"
                                          f"admin_username = {cluster_secrets.USER}\n"
                                          "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                                          # a login checked once a minute, not hashed again on every request
                                          "auth_cache_ttl_seconds = 60\n")
    return MLFLOW_ENV | {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_PASSWORD": made.mlflow_password,
                         "MLFLOW_FLASK_SERVER_SECRET_KEY": made.mlflow_form_key, "PGPASSWORD": made.postgres_password}


def ray_node_env(root: Path) -> dict[str, str]:
    """A Ray node's environment: the graceful-stop setting, the cluster's token, and the MLflow login its stage
    workers up- and download with."""
    made = cluster_secrets.ensure(root)
    return RAY_ENV | cluster_secrets.ray_env(root, made) | cluster_secrets.mlflow_login(made)


def ray_head_command(ports: dict[str, int], temp: Path, cpus: int) -> list[str]:
    # CPUs like the worker's, so that stage work goes to the worker node only when the config pins it there;
    # workers at nice 0 on every node, as on the local cluster a run starts (resources.start_local_cluster):
    # at Ray's nice 15, anything else on this machine preempts the stages
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
            f"--port={ports['ray']}", f"--num-cpus={cpus}", f"--system-config={json.dumps(RAY_SYSTEM_CONFIG)}",
            "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"]


def ray_worker_command(ports: dict[str, int], temp: Path, cpus: int) -> list[str]:
    # one unit of the resource per CPU: every bundle asks for one and holds at least a CPU, so it never runs out first
    return [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", f"--address=127.0.0.1:{ports['ray']}",
            "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", f"--resources={json.dumps({WORKER_RESOURCE: cpus})}",
            f"--temp-dir={temp}", "--disable-usage-stats"]


def prefect_server_command(ports: dict[str, int]) -> list[str]:
    return [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(ports["prefect"])]


def prefect_worker_command(pool: str) -> list[str]:
    return [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"]


def ray_temp_dir(root: Path, node: str) -> Path:
    """Ray's own folder for a node: short, under the system's temp folder, since Ray's socket paths inside
    it must fit in 107 bytes; one per cluster folder, so a second `up` reuses it."""
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:8]
    return private_dir("rlhf-ray") / digest / node


# --- checks before anything starts ------------------------------------------------------------------------


def postgres_bindir() -> Path:
    """The folder of PostgreSQL's server programs: on PATH, else `pg_config --bindir`, else Debian's."""
    found = shutil.which("initdb")
    candidates = [Path(found).parent] if found else []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        candidates.append(Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                              timeout=10, check=True).stdout.strip()))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for bindir in candidates:
        if all((bindir / b).is_file() for b in POSTGRES_BINARIES):
            return bindir
    raise PipelineError("PostgreSQL not found: no initdb and postgres on PATH, in `pg_config --bindir` or in "
                        "/usr/lib/postgresql/*/bin; install its server (Debian: apt-get install postgresql)")


def require_psycopg2() -> None:
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        raise PipelineError("psycopg2 is not installed (MLflow's PostgreSQL driver): pip install -e '.[cluster]'") from None


def postgres_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, it runs as the `postgres` user (else `nobody`)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PipelineError("PostgreSQL does not run as root and this machine has no `postgres` or `nobody` user; "
                        "run `rlhf cluster up` as another user")


def check_enterable(folder: Path, user: str) -> None:
    """`user` must be able to reach `folder`: every folder above it must let others through (o+x)."""
    entry = pwd.getpwnam(user)
    for parent in [*reversed(folder.parents), folder]:
        if not parent.exists():
            break
        st = parent.stat()
        if not (st.st_mode & 0o001 or (st.st_uid == entry.pw_uid and st.st_mode & 0o100)
                or (st.st_gid == entry.pw_gid and st.st_mode & 0o010)):
            raise PipelineError(f"PostgreSQL does not run as root, so it runs as user {user!r} here, who cannot enter "
                                f"{parent}; pick a --dir it can reach, or allow it (chmod o+x {parent})")


def load(root: Path) -> Cluster | None:
    state = root / STATE_FILE
    return Cluster.from_json(root, state.read_text()) if state.is_file() else None


def running(cluster: Cluster) -> list[str]:
    rows = processes.table()
    return [name for name, proc in cluster.procs.items() if processes.alive(proc, rows)]


# --- up ---------------------------------------------------------------------------------------------------


class Starter:
    """Starts the services one by one, recording each in the state file as soon as it runs, so that a
    failure, a Ctrl-C or a later `down` stops exactly what was started."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.popens: dict[str, subprocess.Popen] = {}
        self.began = time.monotonic()

    def folder(self, name: str) -> Path:
        path = self.cluster.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def ray_temp(self, node: str) -> Path:
        temp = ray_temp_dir(self.cluster.root, node)
        temp.mkdir(parents=True, exist_ok=True)
        return temp

    def log(self, name: str) -> Path:
        return self.folder(name) / f"{name}.log"

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None, user: str | None = None) -> None:
        # this process holds the clients' credentials (it is one): a service gets only those given to it
        inherited = {k: v for k, v in os.environ.items() if k not in cluster_secrets.CREDENTIAL_KEYS}
        popen = processes.spawn(command, self.log(name), self.folder(name), {**inherited, **(env or {})}, user)
        self.popens[name] = popen
        self.cluster.procs[name] = processes.proc_of(popen)
        self.cluster.save()

    def wait(self, name: str, ready, what: str) -> None:
        """Until `ready()` holds; one line naming the service and its log when it exits or takes too long."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            code = self.popens[name].poll()
            if code is not None:
                raise PipelineError(f"{name} exited with code {code} while starting; see {self.log(name)}")
            if time.monotonic() > deadline:
                raise PipelineError(f"{name}: {what} not within {START_TIMEOUT_S:.0f} s; see {self.log(name)}")
            time.sleep(0.5)
        print(f"  {name:15} up after {time.monotonic() - self.began:4.1f} s", flush=True)

    def run_once(self, name: str, command: list[str], user: str | None) -> None:
        """A set-up program (initdb), its output in the service's log."""
        with open(self.log(name), "ab") as out:
            code = subprocess.run(command, cwd=self.folder(name), stdout=out, stderr=subprocess.STDOUT,
                                  timeout=START_TIMEOUT_S, **processes.as_user(user)).returncode
        if code:
            raise PipelineError(f"{name}: {command[0]} failed with code {code}; see {self.log(name)}")


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def postgres_answers(ports: dict[str, int], password: str, root: Path) -> bool:
    import psycopg2

    try:
        psycopg2.connect(host="127.0.0.1", port=ports["postgres"], user=DB_USER, password=password, dbname="postgres",
                         connect_timeout=2).close()
        return True
    except psycopg2.OperationalError as exc:
        if "password authentication failed" in str(exc):
            raise PipelineError(f"PostgreSQL in {root / 'postgres' / 'data'} does not take the password in "
                                f"{root / cluster_secrets.SECRETS_FILE}; its data was made with another: restore that "
                                "file, or remove the cluster folder's postgres/ and mlflow/ (their runs with them)") from None
        return False


def check_password_auth(data: Path) -> None:
    """A database an earlier `up` made with trust authentication would take any password: refused."""
    hba = data / "pg_hba.conf"
    rules = [line.split() for line in hba.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if any(rule[-1] == "trust" for rule in rules):
        raise PipelineError(f"{hba}: made by an earlier `rlhf cluster up` without passwords (trust); remove the cluster "
                            f"folder's postgres/ and mlflow/ (their runs with them) and run `rlhf cluster up` again")


def create_database(ports: dict[str, int], password: str) -> None:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=ports["postgres"], user=DB_USER, password=password, dbname="postgres",
                            connect_timeout=5)
    conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,))
            if cur.fetchone() is None:
                cur.execute(f"CREATE DATABASE {DB_NAME}")
    finally:
        conn.close()


def ray_nodes_up(ports: dict[str, int], want: int) -> bool:
    """Whether the cluster has `want` live nodes, asked through GCS as a driver would (`ray.nodes()`)."""
    import ray

    try:
        ray.init(address=urls(ports)["ray"], log_to_driver=False, logging_level=logging.ERROR)
        try:
            return sum(n["Alive"] for n in ray.nodes()) >= want
        finally:
            ray.shutdown()
    except (ConnectionError, RuntimeError):
        return False


def worker_online(ports: dict[str, int], pool: str, auth_string: str) -> bool:
    """Whether a worker of `pool` is ONLINE (it creates the pool, then sends a heartbeat)."""
    basic = base64.b64encode(auth_string.encode()).decode()
    request = urllib.request.Request(f"{urls(ports)['prefect']}/work_pools/{pool}/workers/filter", data=b"{}",
                                     headers={"Content-Type": "application/json", "Authorization": f"Basic {basic}"},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return any(w.get("status") == "ONLINE" for w in json.load(response))
    except OSError:
        return False


def up(root: Path, pool: str, worker_cpus: int) -> Cluster:
    """Start every service, wait until each answers, and register the deployments on `pool`. On a
    failure or Ctrl-C, what was started is stopped again before the error goes on."""
    bindir, db_user = check_can_start(root)
    from stages.common.dist_env import free_port

    made = cluster_secrets.ensure(root)
    # this process is a client too (Ray's driver, Prefect's API): the cluster's credentials, set before Ray
    # first reads its auth mode
    os.environ.update(cluster_secrets.credentials_env(root, made))
    # the modules the last steps use (Ray's driver, the flow the deployments name) import while the servers start
    for module in ("ray", "flows.pipeline"):
        threading.Thread(target=importlib.import_module, args=(module,), daemon=True).start()
    cluster = Cluster(root, pool, worker_cpus, {name: free_port() for name in PORTS})
    starter = Starter(cluster)
    try:
        start_services(starter, bindir, db_user, made)
        from flows.cli.serve import register_deployments

        register_deployments(urls(cluster.ports)["prefect"], pool, [PIN], Path.cwd())
        print(f"  {'deployments':15} on pool {pool} after {time.monotonic() - starter.began:4.1f} s", flush=True)
    except KeyboardInterrupt:
        stop(cluster)
        raise KeyboardInterrupt(f"stopped the services it had started ({', '.join(cluster.procs) or 'none'})") from None
    except BaseException:
        stop(cluster)
        raise
    return cluster


def check_can_start(root: Path) -> tuple[Path, str | None]:
    """(PostgreSQL's programs, the user to run them as), once nothing stands in the way."""
    previous = load(root)
    if previous is not None and running(previous):
        raise PipelineError(f"a cluster started here is still up ({', '.join(running(previous))}; {root / STATE_FILE}); "
                            f"stop it first: rlhf cluster down --dir {root}")
    bindir = postgres_bindir()
    require_psycopg2()
    root.mkdir(parents=True, exist_ok=True)
    db_user = postgres_user()
    if db_user:
        check_enterable(root, db_user)
    return bindir, db_user


def node_env(starter: Starter, node: str) -> dict[str, str]:
    """A node's folder for stage files (inputs, work, outputs: `artifacts.node_files`), as a machine of its
    own would have: the nodes here share a disk, the pipeline must not rely on it."""
    return {"RLHF_NODE_DIR": str(starter.folder(node) / "files")}


def start_services(starter: Starter, bindir: Path, db_user: str | None, made: ClusterSecrets) -> None:
    """The three independent services first (Ray's head, Prefect's server, PostgreSQL), then each one that
    needs another as soon as that one answers; last, the wait for all of them."""
    cluster = starter.cluster
    ports, u, root = cluster.ports, urls(cluster.ports), cluster.root
    starter.start("ray-head", ray_head_command(ports, starter.ray_temp("ray-head"), cluster.worker_cpus),
                  ray_node_env(root) | node_env(starter, "ray-head"))
    # its UI asks the API at PREFECT_API_URL: this server's, whatever this shell has set; a new database
    # is a copy of an empty migrated one (flows/services/prefect_db.py)
    keep_template = prefect_db.seeded(starter.folder("prefect-server"))
    # the API asks for the auth string (its health probe does not); its UI asks the user for it
    starter.start("prefect-server", prefect_server_command(ports),
                  {"PREFECT_HOME": str(starter.folder("prefect-server")), "PREFECT_API_URL": u["prefect"],
                   "PREFECT_SERVER_API_AUTH_STRING": made.prefect_auth_string})
    data = starter.folder("postgres") / "data"
    if db_user:
        shutil.chown(data.parent, db_user)
    if (data / "PG_VERSION").is_file():  # a later `up` reuses the database
        check_password_auth(data)
    else:
        password_file = data.parent / "initdb-password"
        cluster_secrets.write_private(password_file, made.postgres_password + "\n")
        if db_user:
            shutil.chown(password_file, db_user)
        try:
            starter.run_once("postgres", initdb_command(bindir, data, password_file), db_user)
        finally:
            password_file.unlink(missing_ok=True)
    starter.start("postgres", postgres_command(bindir, data, ports["postgres"]), user=db_user)

    starter.wait("postgres", lambda: postgres_answers(ports, made.postgres_password, root), "no connection")
    create_database(ports, made.postgres_password)
    artifacts = starter.folder("mlflow") / "artifacts"
    artifacts.mkdir(exist_ok=True)
    starter.start("mlflow", mlflow_command(ports, artifacts), mlflow_env(root))
    starter.wait("ray-head", lambda: port_open(ports["ray"]), f"nothing listens at {u['ray']}")
    starter.start("ray-worker", ray_worker_command(ports, starter.ray_temp("ray-worker"), cluster.worker_cpus),
                  ray_node_env(root) | node_env(starter, "ray-worker"))
    starter.wait("prefect-server", lambda: answers(u["prefect"] + "/health"), f"no answer at {u['prefect']}/health")
    keep_template()
    env = service_env(root, ports)
    cluster_secrets.write_client_env(root, env)
    starter.start("prefect-worker", prefect_worker_command(cluster.pool),
                  {**env, "PREFECT_HOME": str(starter.folder("prefect-worker"))})

    starter.wait("mlflow", lambda: answers(u["mlflow"] + "/health"), f"no answer at {u['mlflow']}/health")
    starter.wait("ray-worker", lambda: ray_nodes_up(ports, 2), f"the worker node did not join {u['ray']}")
    starter.wait("prefect-worker", lambda: worker_online(ports, cluster.pool, made.prefect_auth_string),
                 f"no worker online in pool {cluster.pool!r}")


# --- down and status --------------------------------------------------------------------------------------


# (signal, to every process the service started); by default SIGTERM to all of them (a Prefect worker's
# flow runs too). PostgreSQL's server stops its own processes (SIGINT: fast shutdown; SIGTERM waits for
# its clients to leave), and so does `ray start --block`, in the order Ray needs.
STOP_WAVES = (("prefect-worker", "ray-worker", "mlflow"), ("prefect-server", "ray-head", "postgres"))
STOPS = {"postgres": (signal.SIGINT, False), "ray-head": (signal.SIGTERM, False), "ray-worker": (signal.SIGTERM, False)}


def stop(cluster: Cluster) -> None:
    """Stop every process `up` started, the clients before the servers they talk to (a Prefect worker
    stopping with its server gone retries its last calls), and forget them (the data stays)."""
    left: set[int] = set()
    for wave in STOP_WAVES:
        leaders = [(cluster.procs[name], *STOPS.get(name, (signal.SIGTERM, True))) for name in wave if name in cluster.procs]
        left |= processes.stop(leaders, STOP_GRACE_S)
    if left:
        raise PipelineError(f"processes {sorted(left)} of the cluster in {cluster.root} did not end after SIGKILL")
    (cluster.root / STATE_FILE).unlink(missing_ok=True)


def down(root: Path) -> Cluster:
    cluster = load(root)
    if cluster is None:
        raise PipelineError(f"no cluster was started in {root} (no {STATE_FILE}); nothing to stop")
    stop(cluster)
    return cluster


def status(root: Path) -> tuple[bool, str]:
    """(every service up, one line per service and the usage when they are)."""
    cluster = load(root)
    if cluster is None:
        return False, f"no cluster was started in {root} (no {STATE_FILE}); start one: rlhf cluster up --dir {root}"
    up_now = set(running(cluster))
    lines = [f"{name:15} {'up' if name in up_now else 'DOWN'}  pid {cluster.procs[name].pid}  log {root / name / (name + '.log')}"
             for name in SERVICES if name in cluster.procs]
    lines += [f"{name:15} not started" for name in SERVICES if name not in cluster.procs]
    healthy = up_now == set(SERVICES)
    return healthy, "\n".join(lines + ([usage(cluster)] if healthy else []))
