"""The MLflow SQLite file is checked before MLflow opens it: damaged or empty, one line naming it."""

import shutil
import sqlite3

import pytest

from artifacts import sqlite_store
from configs.errors import PipelineError


@pytest.fixture
def db(tmp_path, empty_store):
    """A copy of a store MLflow made (its tables and indexes, several pages)."""
    path = tmp_path / "mlflow.db"
    shutil.copyfile(empty_store, path)
    return path


def damaged_line(path) -> str:
    with pytest.raises(PipelineError) as failed:
        sqlite_store.check(path)
    line = str(failed.value)
    assert "\n" not in line and line.startswith(f"{path} is ")
    assert line.endswith("move it away to start a new store, or restore it from a backup")
    return line


def test_a_whole_store_and_a_missing_one_pass(db, tmp_path):
    sqlite_store.check(db)
    sqlite_store.check(tmp_path / "new" / "mlflow.db")  # a new store: MLflow makes it


def test_an_empty_file_is_not_a_new_store(db):
    db.write_bytes(b"")
    assert "is an empty file where the MLflow store should be" in damaged_line(db)
    assert db.stat().st_size == 0


@pytest.mark.parametrize("keep", [1, 50, 4096, "half", "all but one byte"])
def test_a_truncated_store(db, keep):
    size = db.stat().st_size
    keep = {"half": size // 2, "all but one byte": size - 1}.get(keep, keep)
    with open(db, "r+b") as f:
        f.truncate(keep)
    line = damaged_line(db)
    assert "is damaged (truncated: " in line or "is damaged (not an SQLite database" in line, line


def test_garbage_over_a_table_is_found_by_quick_check(db):
    with sqlite3.connect(db) as con:
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()
    con.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(bytes(range(256)) * (page_size // 256))
    line = damaged_line(db)  # SQLite's own words: the image is malformed, or the pages quick_check flagged
    assert "is damaged (" in line and "truncated" not in line and "header" not in line, line


def test_a_wrong_header(db):
    with open(db, "r+b") as f:
        f.write(b"not a database!!")
    assert "not an SQLite database: its header is wrong" in damaged_line(db)


def test_a_store_another_process_is_writing_is_left_to_mlflow(db, monkeypatch):
    """A writer's lock is not damage: MLflow waits for it."""
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_S", 0.05)
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("UPDATE experiments SET name = name")
    try:
        sqlite_store.check(db)
    finally:
        writer.close()


def test_an_empty_file_being_made_by_another_process_passes(tmp_path):
    maker = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
    maker.execute("BEGIN")
    maker.execute("CREATE TABLE t (x)")
    try:
        assert (tmp_path / "mlflow.db").stat().st_size == 0
        sqlite_store.check(tmp_path / "mlflow.db")
    finally:
        maker.close()
