"""The layers' dependency direction, read from the source (every import, function-level ones included, and
every "module:function" entrypoint string): benchmarks → flows → runtime → stages / artifacts → configs,
nothing pointing back, no import cycle; stages/ imports neither Ray, Prefect nor MLflow."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from artifacts import code_graph

ROOT = Path(__file__).parent.parent.parent
PACKAGES = ("benchmarks", "flows", "runtime", "stages", "artifacts", "configs")
# what each top-level package may import of the project (itself always)
MAY_IMPORT = {
    "configs": set(),
    "artifacts": {"configs"},
    "stages": {"configs"},
    "runtime": {"stages", "configs"},
    "flows": {"runtime", "stages", "artifacts", "configs"},
    "benchmarks": {"flows", "runtime", "stages", "artifacts", "configs"},
}
# libraries a package must not import: a stage runs in-process without Ray's harness, Prefect or MLflow
LIBRARIES_OUT = {"stages": {"ray", "prefect", "mlflow"}, "configs": {"torch", "ray", "prefect", "mlflow"}}
# reward and agent files shipped as examples: loaded by path in a stage worker (or the RL driver), never imported by
# configs; like a user's file, one may import libraries and build on a stage's classes (an OpenAIServerExecutor)
LOADED_BY_PATH = ("configs.rewards.", "configs.agents.")
# The one entrypoint string that points up: the RL stage's (a driver stage) is its Ray harness, runtime.rl_driver,
# so that the actors' code is part of the stage's code version; the flow, not the stage, resolves it.
UPWARD_ENTRYPOINTS = {("stages.dag.declaration", "runtime.rl_driver")}
ENTRYPOINT = re.compile(r"""["']((?:""" + "|".join(PACKAGES) + r""")(?:\.\w+)+):(\w+)["']""")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")
            if "__pycache__" not in p.parts}


def imported(path: Path) -> frozenset[str]:
    """Every dotted name `path` imports, at any depth of its code (the code graph's reading of it, which the
    stages' code versions use: `from a import b` names `a` and `a.b`)."""
    return code_graph.imported_names(module_name(path), path.name == "__init__.py", path.read_bytes())


def entrypoints(path: Path) -> set[tuple[str, str]]:
    """The "module:function" strings in a source file."""
    return set(ENTRYPOINT.findall(path.read_text()))


def top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("package", PACKAGES)
def test_a_layer_imports_nothing_above_it(package):
    modules = project_modules()
    offending = []
    for name, path in modules.items():
        if top(name) != package:
            continue
        for target in imported(path):
            by_path = name.startswith(LOADED_BY_PATH)  # a user's kind of file: it may build on a stage's classes
            if (top(target) in PACKAGES and top(target) != package and top(target) not in MAY_IMPORT[package]
                    and not (by_path and top(target) == "stages")) or \
                    (top(target) in LIBRARIES_OUT.get(package, ()) and not by_path):
                offending.append(f"{path.relative_to(ROOT)}: {target}")
        for target, _ in entrypoints(path):
            if top(target) != package and top(target) not in MAY_IMPORT[package] \
                    and (name, target) not in UPWARD_ENTRYPOINTS:
                offending.append(f"{path.relative_to(ROOT)}: entrypoint {target}")
    assert sorted(offending) == []


def test_every_entrypoint_names_a_function_that_exists():
    """The stage entrypoints, the benchmark tables' renderers, the `rlhf` script and the deployments' flow."""
    modules = project_modules()
    named = {(target, func, str(path.relative_to(ROOT))) for path in modules.values() for target, func in entrypoints(path)}
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["rlhf"]
    named.add((*script.split(":"), "pyproject.toml"))
    for deployment in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        file, func = deployment["entrypoint"].split(":")
        named.add((module_name(ROOT / file), func, "prefect.yaml"))
    assert len(named) > 10
    missing = []
    for target, func, where in sorted(named):
        path = modules.get(target)
        defined = path is not None and any(
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func
            for node in ast.parse(path.read_text()).body)
        if not defined:
            missing.append(f"{where}: {target}:{func}")
    assert missing == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle():
    modules = project_modules()
    graph = {name: {t for t in imported(path) if t in modules and t != name} for name, path in modules.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []


def test_the_check_sees_a_forbidden_import_and_entrypoint(tmp_path):
    source = "def f():\n    from runtime.worker_pool import WorkerPool\nSPEC = 'flows.pipeline:rlhf_pipeline'\n"
    assert "runtime.worker_pool" in code_graph.imported_names("stages.bad", False, source.encode())
    (tmp_path / "bad.py").write_text(source)
    assert entrypoints(tmp_path / "bad.py") == {("flows.pipeline", "rlhf_pipeline")}


def test_a_from_import_of_a_module_names_that_module():
    assert "stages.data.files" in project_modules()
    tree = ROOT / "stages" / "dag" / "preflight.py"
    assert {"stages.data.chat_template", "stages.rewards.func_file"} <= imported(tree)
