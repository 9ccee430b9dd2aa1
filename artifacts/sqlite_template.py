"""New SQLite databases copied from an empty migrated one instead of built by their migrations.

Prefect's server and MLflow's tracking store each build a new SQLite database by running every schema
migration in turn: a second or more of one core, spent before a cold `rlhf run` in a new folder starts
its first stage. The schema depends only on the package's version, so the first database built leaves
a copy in ~/.cache/rlhf-pipeline (one per package and version), taken before any run is in it and
cleared of what belongs to its folder; a new database starts from that copy, and the package finds
nothing left to migrate.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import secrets
import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path


def template_file(package: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "rlhf-pipeline" / f"{package}-{importlib.metadata.version(package)}.db"


def migrated(path: Path) -> bool:
    """Whether `path` is a sound SQLite database with a schema (its alembic version recorded)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return db.execute("PRAGMA quick_check").fetchone() == ("ok",) and \
                db.execute("SELECT count(*) FROM alembic_version").fetchone()[0] == 1
    except sqlite3.Error:
        return False


def seed(database: Path | None, template: Path) -> bool:
    """Start a new `database` as a copy of `template`; False (nothing done) when the database exists or
    there is no sound template. An error writing the copy (a full disk) is raised: the database's own
    owner reports it."""
    try:
        if database is None or database.exists() or not template.is_file():
            return False
        if not migrated(template):
            template.unlink(missing_ok=True)  # unreadable: the next database built makes it again
            return False
    except OSError:  # a cache this user cannot read: no template
        return False
    database.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_file(database)
    try:
        shutil.copyfile(template, tmp)
        try:
            os.link(tmp, database)  # whole or not at all, and never over a database another process made meanwhile
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links
            if database.exists():
                return False
            os.replace(tmp, database)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def keep(database: Path | None, template: Path, clear: Sequence[str] = ()) -> bool:
    """Copy the new `database` to `template` (SQLite's online backup: a consistent copy while its owner
    writes), unless there is one already. `clear`: statements run on the copy first, removing what
    belongs to the database's own folder. Only a speed-up: any failure leaves no template, and is
    not raised."""
    if database is None or template.exists() or not database.exists():
        return False
    tmp = None
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        tmp = new_file(template)
        with contextlib.closing(sqlite3.connect(database)) as source, contextlib.closing(sqlite3.connect(tmp)) as copy:
            source.backup(copy)
            for statement in clear:
                copy.execute(statement)
            copy.commit()
            copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file (a server's is WAL)
        if not migrated(tmp):
            return False
        os.replace(tmp, template)  # a concurrent run's copy is as good: the last one stays
        return True
    except (OSError, sqlite3.Error):
        return False
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def new_file(beside: Path) -> Path:
    """An empty file of a new name in `beside`'s folder, made with the permissions the umask gives a new
    file (as the database's owner would make it; `tempfile` makes them private)."""
    while True:
        path = beside.with_name(f".{beside.name}.{secrets.token_hex(4)}")
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return path
        except FileExistsError:
            continue
