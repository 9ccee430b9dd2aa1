"""Full disks for tests. Files: a small tmpfs (`mount` needs root, as in a container; skipped where it is
not allowed). The SQLite store: `PRAGMA max_page_count` on each connection checked out makes every write
that needs a new page fail with SQLITE_FULL ("database or disk is full"), the error a full disk gives,
with no privileges needed."""

import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.pool import Pool


@contextmanager
def sqlite_cannot_grow():
    """Every SQLite connection checked out meanwhile (MLflow's among them) may not add a page."""
    def cap(dbapi_connection, record, proxy):
        dbapi_connection.execute("PRAGMA max_page_count = 1")  # below its size: it stays at its size

    event.listen(Pool, "checkout", cap)
    try:
        yield
    finally:
        event.remove(Pool, "checkout", cap)


@contextmanager
def tmpfs_mounts(root: Path):
    """`mount(size)` -> a fresh tmpfs of that size ("128k") under `root`; all unmounted on exit."""
    mounted = []

    def mount(size: str) -> Path:
        path = root / f"disk{len(mounted)}"
        path.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no mount command here")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for path in mounted:
            subprocess.run(["umount", "-l", str(path)], check=True)
