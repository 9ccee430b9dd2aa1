"""Prefect's database for a new state folder, copied from an empty migrated one
(artifacts/sqlite_template.py).

Prefect's temporary server builds a new SQLite database by running every schema migration in turn:
seconds of one core before a cold `rlhf run` in a new folder starts its first stage. The first server
to build one leaves the template as soon as it answers, before any flow run is in it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from artifacts import sqlite_template

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
    return sqlite_template.template_file("prefect")


def seeded(home: Path | None = None) -> Callable[[], bool]:
    """Seed a new database of a Prefect server about to start (under `home`, else PREFECT_HOME) from the
    template; the returned call, made once the server answers, keeps its database as the template when
    there was none."""
    database, template = database_file(home), template_file()
    sqlite_template.seed(database, template)
    return lambda: sqlite_template.keep(database, template)
