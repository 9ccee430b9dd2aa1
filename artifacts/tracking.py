"""Where MLflow lives: a SQLite store and an artifact root under the project's state folder by
default (absolute paths), `MLFLOW_TRACKING_URI` or `tracking.uri` otherwise. A local SQLite file is
checked before MLflow opens it (`sqlite_store.check`). On a tracking server (`http(s)://`) the server
keeps the artifacts too, and stage workers exchange every file through it (`artifacts.node_files`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from artifacts import disk_full, sqlite_store, sqlite_template
from configs.errors import PipelineError
from configs.redaction import redacted
from configs.schema import TrackingConfig


@dataclass(frozen=True)
class TrackingSetup:
    uri: str
    experiment: str
    state_dir: Path
    system_metrics: bool = True

    @property
    def remote(self) -> bool:
        """A tracking server: no disk is assumed shared between this process and the stage workers."""
        return is_server(self.uri)

    @property
    def artifact_root(self) -> str | None:
        """Where a new experiment's artifacts go: a folder in the state folder, or on a tracking server the
        server's own artifact destination (its proxy, `mlflow server --serve-artifacts`)."""
        return None if self.remote else (self.state_dir / "mlartifacts").as_uri()

    @property
    def sqlite_file(self) -> Path | None:
        return sqlite_store.sqlite_path(self.uri)

    def ui_page(self, page: str) -> str:
        """Where a person opens `page` of the MLflow UI: the tracking server's own UI, or `mlflow ui` on
        the local store first."""
        if self.remote:
            return redacted(f"{self.uri.rstrip('/')}/{page}")
        return redacted(f"mlflow ui --backend-store-uri {self.uri}, then http://127.0.0.1:5000/{page}")


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def resolve_uri(cfg: TrackingConfig) -> str:
    """The tracking URI `resolve` will use, without creating anything."""
    state_dir = Path(cfg.state_dir).expanduser().resolve()
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg.uri or f"sqlite:///{state_dir / 'mlflow.db'}"


def resolve(cfg: TrackingConfig) -> TrackingSetup:
    state_dir = Path(cfg.state_dir).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    uri = resolve_uri(cfg)
    # The registry follows the tracking store; set both for every MLflow client in this process.
    os.environ["MLFLOW_TRACKING_URI"] = uri
    setup = TrackingSetup(uri=uri, experiment=cfg.experiment, state_dir=state_dir, system_metrics=cfg.system_metrics)
    quiet_store_errors()
    if setup.sqlite_file is not None:
        sqlite_store.check(setup.sqlite_file)
    return setup


REACH_TIMEOUT_S = 5.0  # a tracking server or database that does not answer within it is reported, not retried


def check_reachable(uri: str) -> None:
    """One line, at once, when the tracking server or the store's database does not answer; MLflow itself
    retries a refused connection for minutes and then shows its traceback."""
    import socket

    if is_server(uri):
        import requests

        try:
            requests.get(f"{uri.rstrip('/')}/health", timeout=REACH_TIMEOUT_S)
        except requests.RequestException as exc:
            reason = exc.__class__.__name__ if not exc.args else str(exc.args[0]).rsplit(": ", 1)[-1].rstrip(")'\"")
            raise PipelineError(f"tracking.uri={redacted(uri)}: no MLflow server answers ({reason}); start it (`rlhf cluster up` "
                                "starts one here) or point tracking.uri / MLFLOW_TRACKING_URI at a running one") from None
        return
    if uri.split(":", 1)[0].split("+", 1)[0] not in DATABASE_PORTS:
        return
    from sqlalchemy.engine import make_url

    url = make_url(uri)
    host, port = url.host or "localhost", url.port or DATABASE_PORTS[url.get_backend_name()]
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise PipelineError(f"tracking.uri={redacted(uri)}: cannot reach the database at "
                            f"{host}:{port} ({exc.strerror or exc}); start it, or point tracking.uri / "
                            "MLFLOW_TRACKING_URI at a running one") from None


DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


# A new SQLite store's template holds MLflow's schema and none of its rows that name a folder: MLflow
# makes its default experiment again, with an artifact location in the new store's folder.
STORE_TEMPLATE_CLEAR = ("DELETE FROM experiment_tags", "DELETE FROM experiments")


def open_store(setup: TrackingSetup):
    """A client on the store, its tables made (a new SQLite store as a copy of an empty migrated one:
    artifacts/sqlite_template.py). A new SQLite store that the disk had no room for is removed again:
    half its tables would stop the next run's MLflow."""
    from mlflow import MlflowClient

    check_reachable(setup.uri)
    path = setup.sqlite_file
    # a new SQLite store: (its file, the template it starts as a copy of)
    new = (path, sqlite_template.template_file("mlflow")) if path is not None and not path.exists() else None
    try:
        if new:
            sqlite_template.seed(*new)
        client = MlflowClient(setup.uri)
        client.search_experiments(max_results=1)
    except Exception as exc:
        error = disk_full.no_space(exc, setup.state_dir, path)
        if error is None:
            raise
        if new:
            new[0].unlink(missing_ok=True)
        raise error from exc
    if new:
        sqlite_template.keep(*new, clear=STORE_TEMPLATE_CLEAR)
    return client


def experiment_id(client, setup: TrackingSetup) -> str:
    found = client.get_experiment_by_name(setup.experiment)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(setup.experiment, artifact_location=setup.artifact_root)
    except Exception:
        found = client.get_experiment_by_name(setup.experiment)
        if found is None:  # not a lost race with another pipeline run: a real failure (a full disk)
            raise
        return found.experiment_id


class _NoTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


def quiet_store_errors() -> None:
    """MLflow logs the traceback of every database error it then raises; the caller reports the error
    (one line on the terminal, the traceback in the run's `rlhf.error` tag), so MLflow's copy is dropped."""
    logger = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _NoTraceback) for f in logger.filters):
        logger.addFilter(_NoTraceback())


def artifact_dir(artifact_uri: str) -> Path | None:
    """The folder an artifact URI names on this machine (a `file:` URI or a bare path); None for a remote one."""
    parsed = urlparse(artifact_uri)
    return Path(unquote(parsed.path)) if parsed.scheme in ("", "file") else None
