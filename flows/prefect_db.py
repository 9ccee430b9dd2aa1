"""Prefect's database for a new state folder, copied from an empty migrated one.

Prefect's temporary server builds a new SQLite database by running every schema migration in turn:
seconds of one core, and the longest wait before a cold `rlhf run` in a new folder starts its first
stage. The schema depends only on Prefect's version, so the first server to build one leaves a copy in
~/.cache/rlhf-pipeline (one per Prefect version), taken as soon as it answers, before any flow run is
in it; a new folder starts from that copy, and its server finds nothing left to migrate.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

SQLITE_PREFIX = "sqlite+aiosqlite:///"


DATABASE_URL_VARS = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")


def database_file(home: Path | None = None) -> Path | None:
    """The SQLite file a Prefect server under `home` (else PREFECT_HOME, else ~/.prefect) uses, as its
    settings default it: None when the environment names another database. Read from the environment,
    without importing Prefect: once imported, Prefect keeps the settings of that moment, and `rlhf serve`
    sets PREFECT_API_URL only after its server answers."""
    url = next((os.environ[k] for k in DATABASE_URL_VARS if os.environ.get(k)), None)
    if url is None:
        home = home or Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
        return Path(home).expanduser() / "prefect.db"
    if not url.startswith(SQLITE_PREFIX) or ":memory:" in url:
        return None
    return Path(url.removeprefix(SQLITE_PREFIX)).expanduser()


def template_file() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rlhf-pipeline" / f"prefect-{importlib.metadata.version('prefect')}.db"


def migrated(path: Path) -> bool:
    """Whether `path` is a sound SQLite database with Prefect's schema (its alembic version recorded)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return db.execute("PRAGMA quick_check").fetchone() == ("ok",) and \
                db.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
    except sqlite3.Error:
        return False


def seed(database: Path | None, template: Path) -> bool:
    """Start a new `database` as a copy of `template`; False (nothing done) when the database exists or
    there is no sound template."""
    if database is None or database.exists() or not template.is_file():
        return False
    if not migrated(template):
        template.unlink(missing_ok=True)  # unreadable: the next server to build a database makes it again
        return False
    database.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=database.parent, prefix=f".{database.name}.")
    os.close(fd)
    try:
        shutil.copyfile(template, tmp)
        os.replace(tmp, database)  # whole or not at all
    finally:
        Path(tmp).unlink(missing_ok=True)
    return True


def keep_template(database: Path | None, template: Path) -> bool:
    """Copy the running server's new `database` to `template` (SQLite's online backup: a consistent
    copy while the server writes), unless there is one already."""
    if database is None or template.exists() or not database.exists():
        return False
    template.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=template.parent, prefix=f".{template.name}.")
    os.close(fd)
    try:
        with contextlib.closing(sqlite3.connect(database)) as source, contextlib.closing(sqlite3.connect(tmp)) as copy:
            source.backup(copy)
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file (the server's is WAL)
        if not migrated(Path(tmp)):
            return False
        os.replace(tmp, template)  # a concurrent run's copy is as good: the last one stays
        return True
    except sqlite3.Error:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def seeded(home: Path | None = None) -> Callable[[], bool]:
    """Seed a new database of a Prefect server about to start (under `home`, else PREFECT_HOME) from the
    template; the returned call, made once the server answers, keeps its database as the template when
    there was none."""
    database, template = database_file(home), template_file()
    seed(database, template)
    return lambda: keep_template(database, template)
