"""The layers' dependency direction, read from the source (every import, function-level ones included):
stages/ imports neither Ray's harness (runtime/), Prefect, MLflow nor the flow; artifacts/ imports no stage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent

FORBIDDEN = {
    "stages": ("runtime", "flows", "artifacts", "prefect", "mlflow", "ray"),
    "artifacts": ("stages", "runtime", "flows"),
    "configs": ("stages", "runtime", "flows", "artifacts"),
}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(package):
    offending = sorted(f"{path.relative_to(ROOT)}: {name}" for path in (ROOT / package).rglob("*.py")
                       for name in imported(path) if name.split(".")[0] in FORBIDDEN[package])
    assert offending == []


def test_the_check_sees_a_forbidden_import(tmp_path):
    (tmp_path / "bad.py").write_text("def f():\n    from runtime.worker_pool import WorkerPool\n")
    assert "runtime.worker_pool" in imported(tmp_path / "bad.py")
