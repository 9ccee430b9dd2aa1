"""Hugging Face checkpoints: load and save (where one is, and whether a path is one: `checkpoint_paths`)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers import __version__ as transformers_version

from configs.errors import CheckpointError, first_line
from configs.schema import ModelConfig
from stages.common import liger
from stages.common.checkpoint_paths import resolve
from stages.common.precision import torch_dtype


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    source = resolve(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # the hub/IO error types vary; one line is what the user needs
        raise CheckpointError(f"{source}: cannot load tokenizer ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


CAUSAL_LM_EXAMPLES = "a decoder-only language model checkpoint (e.g. Llama, Qwen2, Mistral, Mixtral)"


def require_causal_lm(path: str | Path, model_cfg: ModelConfig, field: str = "model.name_or_path") -> None:
    """A one-line CheckpointError unless the checkpoint's config.json names a model that transformers
    (or, with trust_remote_code, the checkpoint's own code) has a causal-LM class for."""
    source = resolve(path)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=model_cfg.trust_remote_code)
    except ValueError as exc:
        if f"model type `{model_type_of(source)}`" in str(exc):  # a model_type this transformers does not know
            raise CheckpointError(f"{field}={source}: config.json has model_type {model_type_of(source)!r}, which "
                                  f"transformers {transformers_version} does not know; use {CAUSAL_LM_EXAMPLES}") from exc
        raise CheckpointError(f"{field}={source}: cannot read config.json ({first_line(exc)})") from exc
    except Exception as exc:  # custom code not trusted, unreadable file, unreachable hub: one line each
        raise CheckpointError(f"{field}={source}: cannot read config.json ({type(exc).__name__}: {first_line(exc)})") from exc
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING or "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {}):
        return
    raise CheckpointError(f"{field}={source}: config.json has model_type {config.model_type!r} (architectures "
                          f"{config.architectures}), which has no causal-LM class in transformers; use {CAUSAL_LM_EXAMPLES}")


def model_type_of(source: str) -> str | None:
    """The model_type a local checkpoint's config.json declares."""
    try:
        return json.loads((Path(source) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def load_causal_lm(path: str | Path, model_cfg: ModelConfig, precision: str = "fp32", kernels: bool = True,
                   **kwargs) -> PreTrainedModel:
    """`kwargs` go to `from_pretrained` (e.g. QLoRA's quantization config). `kernels`: Liger's, where
    `model.use_liger_kernel` asks for them (off for a model that is only copied, never run)."""
    source = resolve(path)
    if kernels and model_cfg.use_liger_kernel:
        liger.require()  # before the weights load
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=torch_dtype(precision),
            attn_implementation=attn_implementation(model_cfg),
            trust_remote_code=model_cfg.trust_remote_code,
            **kwargs,
        )
    except Exception as exc:
        raise CheckpointError(f"{source}: cannot load as a causal LM ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
    if kernels and model_cfg.use_liger_kernel:
        liger.apply(model)
    return model


@contextmanager
def new_head():
    """Loading a causal LM's checkpoint under a scalar head (a reward model, a critic): its LM head goes
    unused and the new head starts from scratch, as meant; transformers' load report (a table of the two)
    is left off the terminal, its other warnings not."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def default_device() -> str:
    """Where a model that only scores or samples runs: this process's GPU where it has one (Ray gives a
    worker its own through CUDA_VISIBLE_DEVICES)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_frozen_lm(path: str | Path, model_cfg: ModelConfig, precision: str = "fp32") -> PreTrainedModel:
    """A causal LM that is never trained (reference, rollout engine, eval), in eval mode on `default_device`."""
    # transformers wraps `to` in functools.wraps, whose typeshed type does not bind `self`
    return load_causal_lm(path, model_cfg, precision).to(default_device()).eval()  # type: ignore[arg-type]


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
