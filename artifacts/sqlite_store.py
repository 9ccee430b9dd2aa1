"""The local MLflow SQLite file, checked before MLflow opens it: MLflow would fill an empty file with
new tables (the store's history silently gone) and fails on a damaged one deep inside SQLAlchemy.

A missing file is a new store; an existing one must be a whole SQLite database.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from configs.errors import PipelineError

HEADER = b"SQLite format 3\x00"
HEADER_SIZE = 100
DAMAGE_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
WHAT_TO_DO = "move it away to start a new store, or restore it from a backup"
BUSY_TIMEOUT_S = 10.0  # how long the check waits for a writer's lock before leaving the file to MLflow


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` tracking URI, else None (a server, another database)."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def check(path: Path) -> None:
    """One line naming the file and what to do when it is not a usable store."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0 and not in_transaction(path):  # with a journal beside it, another process is making it now
        raise PipelineError(f"{path} is an empty file where the MLflow store should be (its runs are lost, "
                            f"or it was never written); {WHAT_TO_DO}")
    problem = damage(path, size) if size else None
    if problem:
        raise PipelineError(f"{path} is damaged ({problem}); {WHAT_TO_DO}")


def damage(path: Path, size: int) -> str | None:
    """What is wrong with a non-empty SQLite file, or None: its header, its length against the page count
    the header records, then SQLite's own `quick_check` of every page (on a read-only connection)."""
    with open(path, "rb") as f:
        header = f.read(HEADER_SIZE)
    if not header.startswith(HEADER):
        return "not an SQLite database: its header is wrong"
    if len(header) < HEADER_SIZE:
        return f"truncated: {size} bytes, shorter than its header"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # the page count is valid only when written with the change counter, and the file is whole only
    # between transactions (a journal beside it: one is under way, or a crashed one SQLite rolls back)
    counted = header[24:28] == header[92:96] and not in_transaction(path)
    if counted and size < pages * page_size:
        return f"truncated: {size} bytes, its header says {pages * page_size}"
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)) as db:
            rows = db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        # busy, locked or a journal to roll back first: in use by another process, not damaged; MLflow waits or says so
        return str(exc) if getattr(exc, "sqlite_errorcode", 0) & 0xFF in DAMAGE_CODES else None
    if rows == [("ok",)]:
        return None
    problems = [line for row in rows for line in str(row[0]).splitlines() if not line.startswith("***")]
    return f"{problems[0] if problems else rows[0][0]}; SQLite's quick_check found {len(problems)} problem(s)"


def in_transaction(path: Path) -> bool:
    return any(path.with_name(path.name + suffix).exists() for suffix in ("-journal", "-wal"))
