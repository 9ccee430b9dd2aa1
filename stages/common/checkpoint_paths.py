"""Where a model checkpoint is, and whether a path is one, decided from its files without loading it
(and without importing torch or transformers: the flow's driver checks paths before any work starts).

A checkpoint is a Hugging Face model directory, a hub id, a LoRA adapter directory (`adapter_config.json`),
or a stage output standing for a model not copied into the store: a directory holding
`checkpoint_ref.json`, which `resolve` follows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from configs.errors import CheckpointError

POINTER_FILE = "checkpoint_ref.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_CONFIG = "adapter_config.json"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def write_pointer(out_dir: Path, name_or_path: str) -> Path:
    """A pointer to a hub id, or to a local directory by its absolute path (`~` and relative paths resolved)."""
    local = Path(name_or_path).expanduser()
    if local.exists():
        name_or_path = str(local.resolve())
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / POINTER_FILE).write_text(json.dumps({"name_or_path": name_or_path}))
    return out_dir


def resolve(path: str | Path) -> str:
    """The loadable location behind a checkpoint directory or pointer."""
    pointer = Path(path) / POINTER_FILE
    if pointer.is_file():
        return json.loads(pointer.read_text())["name_or_path"]
    local = Path(path).expanduser()
    return str(local) if local.exists() else str(path)


def validate(name_or_path: str, field: str = "model.name_or_path") -> None:
    """Fail with one line unless `name_or_path` is a local HF model directory or looks like a hub id."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise CheckpointError(f"{field}={name_or_path}: is a file, expected a Hugging Face model directory")
        if not (path / "config.json").is_file():
            raise CheckpointError(
                f"{field}={name_or_path}: not a checkpoint (no config.json; expected a directory written by save_pretrained)"
            )
        if not any((path / f).is_file() for f in WEIGHT_FILES) and not list(path.glob("*.safetensors")):
            raise CheckpointError(f"{field}={name_or_path}: not a checkpoint (config.json but no model weights)")
        return
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
    if looks_local or not HUB_ID.match(name_or_path):
        raise CheckpointError(f"{field}={name_or_path}: no such directory (and not a hub id like org/name)")


def is_adapter(path: str | Path) -> bool:
    """A LoRA adapter saved by peft: its weights mean nothing without the base model it names."""
    return (Path(path) / ADAPTER_CONFIG).is_file()
