"""Stage fingerprints: hash(stage name, its resolved config keys, its inputs' identities, the content of
the local files it reads, its code)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from artifacts import code_graph
from artifacts.file_hashes import FileHashes


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


def code_version(entry: str, packages: tuple[str, ...] = code_graph.PROJECT_PACKAGES,
                 search: list[Path] | None = None) -> str:
    """A hash of the source of module `entry` and of every project module it imports, transitively, each
    under its module name: the same code gives the same version wherever the checkout lives (`search`:
    the folders to find the packages in, else where imports find them)."""
    # The imports are followed as they are: a stage that imports configs.schema (all do, through
    # stages.dag.contract) is invalidated by a schema edit although its config keys count by value. A
    # missed cache hit costs a rerun; a missed dependency serves a stale result.
    digest = hashlib.sha256()
    for name, file in code_graph.module_closure(entry, packages, search).items():
        source = file.read_bytes()
        digest.update(f"{name}:{len(source)}:".encode())
        digest.update(source)
    return digest.hexdigest()[:16]


def fingerprint(stage: str, config: dict[str, Any], inputs: dict[str, str], code: str) -> str:
    """Deterministic: key order never matters; any change to any part changes the result."""
    payload = json.dumps({"stage": stage, "config": config, "inputs": inputs, "code": code}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def local_sources(values: dict[str, Any], fallback_dir: Path | None = None,
                  hash_cache: Path | None = None) -> dict[str, str]:
    """`{"source:<key>[<i>]/<file in a folder>": "<size>:<sha256>"}` for every value (or list item) that
    names a local file or folder (`json@DIR` included); hub ids and empty values contribute nothing. A
    relative path not found from the working directory is looked up in `fallback_dir` (as reward files
    are). Entries name the config key, never where the file lies: the same content gives the same
    fingerprint from any checkout, copy or node. `hash_cache`: the JSON file that keeps the hashes."""
    hashes = FileHashes(hash_cache)
    found: dict[str, str] = {}
    for key, value in values.items():
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item:
                continue
            path = Path(item.removeprefix("json@")).expanduser()
            if not path.exists() and not path.is_absolute() and fallback_dir is not None:
                path = fallback_dir / path
            name = f"source:{key}[{i}]" if isinstance(value, list) else f"source:{key}"
            if path.is_file():
                found[name] = hashes.digest(path)
            elif path.is_dir():
                for file in sorted(f for f in path.rglob("*") if f.is_file()):
                    found[f"{name}/{file.relative_to(path).as_posix()}"] = hashes.digest(file)
    hashes.save()
    return found
