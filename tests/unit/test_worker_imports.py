"""The marks a stage worker starts with (stages/common/worker_imports.py): set, and lifted without touching anyone else's;
and DeepSpeed imported without MLflow."""

import subprocess
import sys

import pytest

from stages.common import worker_imports


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


def test_a_module_kept_out_while_importing_is_importable_after(tmp_path, monkeypatch):
    (tmp_path / "optional_extra.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "optional_extra", raising=False)
    with worker_imports.absent_while_importing("optional_extra"), pytest.raises(ImportError):
        import optional_extra
    import optional_extra

    assert optional_extra.VALUE == 7
    with worker_imports.absent_while_importing("optional_extra"):  # imported already: left as it is
        assert sys.modules["optional_extra"] is optional_extra
    monkeypatch.delitem(sys.modules, "optional_extra")


TRAINER = """
import sys
from stages.common import deepspeed_engine
deepspeed_engine.import_deepspeed()
from deepspeed.autotuning import autotuner
print("mlflow" in sys.modules, autotuner.has_mlflow)
import mlflow
print(bool(mlflow.MlflowClient))
"""


@pytest.mark.slow  # a fresh interpreter importing DeepSpeed
def test_a_process_that_trains_imports_deepspeed_without_mlflow_and_can_import_it_later():
    done = subprocess.run([sys.executable, "-c", TRAINER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["False False", "True"]  # DeepSpeed prints its accelerator before
