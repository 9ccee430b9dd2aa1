"""The marks a stage worker starts with (stages/worker_imports.py): set, and lifted without touching anyone else's."""

import sys

from stages import worker_imports


def test_the_marks_are_lifted_and_no_other(monkeypatch):
    for name in worker_imports.NOT_IMPORTED_IN_WORKERS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "someone_elses_block", None)
    worker_imports.mark_absent()
    assert all(sys.modules[name] is None for name in worker_imports.NOT_IMPORTED_IN_WORKERS)
    worker_imports.lift_marks()
    assert not set(worker_imports.NOT_IMPORTED_IN_WORKERS) & set(sys.modules)
    assert sys.modules["someone_elses_block"] is None


def test_an_imported_module_is_neither_marked_nor_lifted(monkeypatch):
    name = worker_imports.NOT_IMPORTED_IN_WORKERS[0]
    loaded = object()
    monkeypatch.setitem(sys.modules, name, loaded)
    worker_imports.mark_absent()
    worker_imports.lift_marks()
    assert sys.modules[name] is loaded
