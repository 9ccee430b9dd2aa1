"""New SQLite databases copied from an empty migrated one (artifacts/sqlite_template.py): Prefect's
server database (flows/services/prefect_db.py) on real SQLite files, where a database in WAL mode with a writer
open stands for the running server's, and MLflow's tracking store (`tracking.open_store`) itself."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
import sys

from artifacts import sqlite_template, tracking
from configs import load_config
from flows.services import prefect_db


def server_database(path, version: str = "a3b9c7d2e5f1") -> sqlite3.Connection:
    """A database as a running Prefect server holds it: WAL mode, migrated, its connection still open."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE alembic_version (version_num TEXT)")
    db.execute("INSERT INTO alembic_version VALUES (?)", (version,))
    db.execute("CREATE TABLE block_type (name TEXT)")
    db.executemany("INSERT INTO block_type VALUES (?)", [(f"block-{i}",) for i in range(50)])
    db.commit()
    return db


def rows(path, table: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(f"SELECT * FROM {table}").fetchall()


def test_the_first_server_leaves_a_template_that_a_new_folder_starts_from(tmp_path):
    first, template, second = tmp_path / "a" / "prefect.db", tmp_path / "cache" / "prefect-3.db", tmp_path / "b" / "prefect.db"
    first.parent.mkdir()
    live = server_database(first)
    try:
        assert not sqlite_template.seed(first, template)  # nothing to copy yet: the server migrates
        assert sqlite_template.keep(first, template)
        live.execute("INSERT INTO block_type VALUES ('after the copy')")  # the server goes on writing
        live.commit()
    finally:
        live.close()
    assert sqlite_template.migrated(template)
    assert rows(template, "alembic_version") == [("a3b9c7d2e5f1",)] and len(rows(template, "block_type")) == 50
    assert not list(template.parent.glob("*-wal")) and not list(template.parent.glob(".prefect-3.db.*"))
    assert sqlite_template.seed(second, template)
    assert rows(second, "block_type") == rows(template, "block_type")
    assert not sqlite_template.keep(second, template)  # one template is enough


def test_an_existing_database_is_never_replaced(tmp_path):
    template, database = tmp_path / "prefect-3.db", tmp_path / "home" / "prefect.db"
    server_database(template).close()
    database.parent.mkdir()
    database.write_bytes(b"the user's flow runs")
    assert not sqlite_template.seed(database, template)
    assert database.read_bytes() == b"the user's flow runs"


def test_an_unsound_template_is_dropped_and_the_server_migrates(tmp_path):
    template, database = tmp_path / "prefect-3.db", tmp_path / "home" / "prefect.db"
    template.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)  # cut short: not a database
    assert not sqlite_template.seed(database, template)
    assert not template.exists() and not database.exists()
    with contextlib.closing(sqlite3.connect(template)) as db:  # a database, but no migration recorded
        db.execute("CREATE TABLE flow (id TEXT)")
    assert not sqlite_template.seed(database, template) and not database.exists()


def test_a_database_made_while_the_template_is_copied_is_kept(tmp_path, monkeypatch):
    template, database = tmp_path / "prefect-3.db", tmp_path / "home" / "prefect.db"
    server_database(template).close()
    copy = sqlite_template.shutil.copyfile

    def racing(src, dst):  # another process makes the database meanwhile
        database.write_bytes(b"the other run's database")
        return copy(src, dst)

    monkeypatch.setattr(sqlite_template.shutil, "copyfile", racing)
    assert not sqlite_template.seed(database, template)
    assert database.read_bytes() == b"the other run's database" and not list(database.parent.glob(".prefect.db.*"))


def test_a_filesystem_without_hard_links_still_gets_the_copy_with_the_umasks_permissions(tmp_path, monkeypatch):
    template, database = tmp_path / "prefect-3.db", tmp_path / "home" / "prefect.db"
    server_database(template).close()

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(sqlite_template.os, "link", no_links)
    umask = os.umask(0o022)
    os.umask(umask)
    assert sqlite_template.seed(database, template)
    assert rows(database, "block_type") == rows(template, "block_type")
    assert database.stat().st_mode & 0o777 == 0o666 & ~umask  # as its owner would make it, not private
    assert not list(database.parent.glob(".prefect.db.*"))


def test_a_cache_that_cannot_be_written_leaves_no_template_and_no_error(tmp_path):
    database = tmp_path / "prefect.db"
    server_database(database).close()
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    assert not sqlite_template.keep(database, tmp_path / "cache" / "rlhf-pipeline" / "prefect-3.db")


def test_a_new_mlflow_store_starts_from_the_first_ones_template_with_its_own_default_experiment(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def opened(folder: str):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)  # MLflow's default experiment keeps its artifacts under the cwd
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        setup = tracking.resolve(load_config(None, [f"tracking.state_dir={tmp_path / folder}"]).tracking)
        client = tracking.open_store(setup)
        return setup, client, tracking.experiment_id(client, setup)

    first, _, first_experiment = opened("first")
    template = sqlite_template.template_file("mlflow")
    assert sqlite_template.migrated(template) and rows(template, "experiments") == []  # nothing of the first folder
    second, client, experiment = opened("second")
    assert experiment == first_experiment == "1"  # numbered as in a store MLflow migrated itself
    default = client.get_experiment("0")
    assert default.name == "Default" and default.artifact_location == str(tmp_path / "second" / "mlruns" / "0")
    run = client.create_run(experiment).info.run_id
    client.log_metric(run, "loss", 0.5)
    assert client.get_run(run).data.metrics == {"loss": 0.5}
    assert rows(first.sqlite_file, "alembic_version") == rows(second.sqlite_file, "alembic_version")


def test_the_database_file_is_prefects_sqlite_file_under_its_home_or_none(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    monkeypatch.delenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    assert prefect_db.database_file() == tmp_path / "prefect.db"
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://u:p@db:5432/prefect")
    assert prefect_db.database_file() is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert prefect_db.template_file().parent == tmp_path / "cache" / "rlhf-pipeline"


def test_seeding_a_servers_database_leaves_prefect_unimported(tmp_path):
    """Prefect, once imported, keeps the settings of that moment: `rlhf serve` seeds its server's database
    before PREFECT_API_URL names that server, so the seeding must not import it (else the deployments
    go to a temporary server of their own)."""
    code = ("import sys; from pathlib import Path; from flows.services import prefect_db; "
            f"prefect_db.seeded(Path({str(tmp_path)!r})); print('prefect' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]
