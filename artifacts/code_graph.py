"""The project modules a module runs: itself and, transitively, every project module it imports,
found by reading the source (`ast`), never by importing it. A stage's code version hashes them."""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import threading
from pathlib import Path

PROJECT_PACKAGES = ("artifacts", "configs", "flows", "runtime", "stages")  # what pyproject installs; all else is a library


def package_dirs(packages: tuple[str, ...], search: list[Path] | None = None) -> dict[str, Path]:
    """`{"stages": <its folder>}` for each top-level package that imports would find, or that is found
    in the `search` folders (looking a top-level name up runs none of its code)."""
    dirs = {}
    for name in packages:
        if search is None:
            spec = importlib.util.find_spec(name)
        else:
            spec = importlib.machinery.PathFinder.find_spec(name, [str(folder) for folder in search])
        if spec is not None and spec.submodule_search_locations:
            dirs[name] = Path(next(iter(spec.submodule_search_locations)))
    return dirs


def module_file(name: str, dirs: dict[str, Path]) -> Path | None:
    """The source file of a dotted module name (a package's `__init__.py`), or None when it is none of ours."""
    top, *rest = name.split(".")
    if top not in dirs:
        return None
    path = dirs[top].joinpath(*rest)
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if rest and path.with_suffix(".py").is_file() else None


# The flow fingerprints stages from several task threads at once, and CPython 3.11's ast.parse is not safe
# to run concurrently ("AST constructor recursion depth mismatch"): one parse at a time.
PARSE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1024)
def imported_names(name: str, is_package: bool, source: bytes) -> frozenset[str]:
    """Every dotted name the module's source imports, anywhere (imports inside functions included), with
    `from pkg import x` giving both `pkg` and `pkg.x` (x may be a submodule), relative imports made
    absolute, and `importlib.import_module("literal")` calls counted as imports. Kept per source text."""
    package = name if is_package else name.rpartition(".")[0]
    names: set[str] = set()
    with PARSE_LOCK:
        tree = ast.parse(source, filename=name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and (module := literal_import(node)) is not None:
            names.add(module)
    return frozenset(names)


def literal_import(call: ast.Call) -> str | None:
    """`"a.b"` of `importlib.import_module("a.b")` or `import_module("a.b")`; None for any other call."""
    func = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
    if func == "import_module" and call.args and isinstance(call.args[0], ast.Constant):
        return call.args[0].value if isinstance(call.args[0].value, str) else None
    return None


def module_closure(entry: str, packages: tuple[str, ...] = PROJECT_PACKAGES,
                   search: list[Path] | None = None) -> dict[str, Path]:
    """`{module name: source file}` of `entry` and every module of `packages` it imports, transitively.
    Importing `a.b.c` runs `a` and `a.b` (their `__init__`) too, so they count."""
    dirs = package_dirs(packages, search)
    if module_file(entry, dirs) is None:
        raise ValueError(f"cannot find module {entry} in the packages {', '.join(packages)}")
    found: dict[str, Path] = {}
    pending = [entry]
    while pending:
        name = pending.pop()
        parts = name.split(".")
        for prefix in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if prefix not in found and (file := module_file(prefix, dirs)) is not None:
                found[prefix] = file
                pending.extend(imported_names(prefix, file.name == "__init__.py", file.read_bytes()))
    return dict(sorted(found.items()))
