"""Hugging Face checkpoints: validate, resolve pointers, load and save.

A stage output that stands for a model not copied into the store (a hub id or a local path
named in the config) is a directory holding `checkpoint_ref.json`; `resolve` follows it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from configs.errors import CheckpointError
from configs.schema import ModelConfig

POINTER_FILE = "checkpoint_ref.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    source = resolve(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # the hub/IO error types vary; one line is what the user needs
        raise CheckpointError(f"{source}: cannot load tokenizer ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str | Path, model_cfg: ModelConfig, precision: str = "fp32", **kwargs) -> PreTrainedModel:
    """`kwargs` go to `from_pretrained` (e.g. QLoRA's quantization config)."""
    source = resolve(path)
    try:
        return AutoModelForCausalLM.from_pretrained(
            source,
            dtype=DTYPES[precision],
            attn_implementation=attn_implementation(model_cfg),
            trust_remote_code=model_cfg.trust_remote_code,
            **kwargs,
        )
    except Exception as exc:
        raise CheckpointError(f"{source}: cannot load as a causal LM ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc


def flash_attn_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def attn_implementation(model_cfg: ModelConfig) -> str:
    """What `from_pretrained` gets: `auto` is flash_attention_2 where it can run (a CUDA GPU with
    flash-attn installed), else PyTorch SDPA; flash_attention_2 asked for where it cannot run is an error."""
    attn = model_cfg.attn_implementation
    if attn == "auto":
        return "flash_attention_2" if flash_attn_available() else "sdpa"
    if attn == "flash_attention_2":
        require_flash_attn()
    return attn


def require_flash_attn() -> None:
    if not torch.cuda.is_available():
        raise CheckpointError("model.attn_implementation=flash_attention_2 needs a CUDA GPU; use sdpa on this machine")
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        raise CheckpointError(
            "model.attn_implementation=flash_attention_2 needs flash-attn: pip install 'rlhf-pipeline[gpu]'"
        ) from None


def save_work_file(obj, path: Path, is_main: bool, world_size: int) -> None:
    """`torch.save` by rank 0, written aside and renamed (a killed save leaves no half-written file that a
    resume would trust); every rank waits until it is there."""
    if is_main:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(obj, tmp)
        tmp.replace(path)
    if world_size > 1:
        torch.distributed.barrier()


def save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path, state_dict: dict | None = None) -> Path:
    """An HF directory (safetensors + tokenizer + chat template) that `from_pretrained` loads as is."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
