"""Stage fingerprints: hash(stage name, its resolved config keys, its inputs' identities, its code)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel


def config_subset(config: BaseModel, keys: tuple[str, ...]) -> dict[str, Any]:
    """`{"sft": {...}, "infra.zero_stage": 2}` for the dotted `keys`, as plain JSON values."""
    dumped = config.model_dump(mode="json")
    subset = {}
    for key in keys:
        node: Any = dumped
        for part in key.split("."):
            node = None if node is None else node[part]  # an unset optional section holds nothing
        subset[key] = node
    return subset


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> `{"a.b": value}` (for MLflow params)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def code_version(modules: tuple[str, ...]) -> str:
    """A hash of the source files of the given modules (a package counts all its .py files)."""
    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ValueError(f"cannot find module {name}")
        origin = Path(spec.origin)
        files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
        for file in files:
            digest.update(f"{name}:{file.relative_to(origin.parent)}".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def fingerprint(stage: str, config: dict[str, Any], inputs: dict[str, str], code: str) -> str:
    """Deterministic: key order never matters; any change to any part changes the result."""
    payload = json.dumps({"stage": stage, "config": config, "inputs": inputs, "code": code}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def local_sources(values: dict[str, Any], fallback_dir: Path | None = None) -> dict[str, str]:
    """`{"source:<path>": "<size>:<mtime_ns>" per file}` for every value (or list item) that names a
    local file or folder (`json@DIR` included); hub ids and empty values contribute nothing. A relative
    path not found from the working directory is looked up in `fallback_dir` (as reward files are)."""
    found: dict[str, str] = {}
    for value in values.values():
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, str) or not item:
                continue
            path = Path(item.removeprefix("json@")).expanduser()
            if not path.exists() and not path.is_absolute() and fallback_dir is not None:
                path = fallback_dir / path
            files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path] if path.is_file() else []
            for file in files:
                stat = file.stat()
                found[f"source:{file.resolve()}"] = f"{stat.st_size}:{stat.st_mtime_ns}"
    return found
