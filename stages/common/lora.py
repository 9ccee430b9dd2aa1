"""LoRA adapters with peft for the training stages: wrap a model, save only the adapter (with a
signature of the base weights it was trained on, so merging it onto another base is refused)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from configs.errors import CheckpointError
from configs.schema import LoRAConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EXTRA_FILE = "adapter_extra.json"
FRESH_HEADS = ("score.", "classifier.")  # initialised by the stage, saved with the adapter: not part of the base


def apply(model: torch.nn.Module, cfg: LoRAConfig, task_type: str) -> torch.nn.Module:
    """`model` with LoRA adapters on `cfg.target_modules`; for SEQ_CLS / TOKEN_CLS peft also trains the
    fresh head in full (so it gets no adapter of its own, even under `all-linear`)."""
    from peft import LoraConfig, get_peft_model

    peft_cfg = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules, task_type=task_type,
        exclude_modules=[head.rstrip(".") for head in FRESH_HEADS] if task_type != "CAUSAL_LM" else None,
    )
    return get_peft_model(model, peft_cfg)


def base_signature(model: PreTrainedModel) -> str:
    """A fingerprint of a base model's weights, cheap next to loading them: names, shapes and sums of
    the input embeddings and the norm weights. QLoRA never quantizes those, so a 4-bit base and the
    full-precision checkpoint it came from agree, and any fine-tuning of the base changes them."""
    embeddings = {id(p) for p in model.get_input_embeddings().parameters()}
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if name.startswith(FRESH_HEADS) or not (id(param) in embeddings or any("norm" in part for part in name.split(".")[:-1])):
            continue
        t = param.detach().double()
        digest.update(f"{name}:{tuple(t.shape)}:{float(t.sum()):.6e}:{float(t.abs().sum()):.6e};".encode())
    return digest.hexdigest()[:16]


def require_qlora(field: str) -> None:
    """QLoRA's 4-bit base needs bitsandbytes on a CUDA GPU: one line saying which is missing."""
    if not torch.cuda.is_available():
        raise CheckpointError(f"{field}.load_in_4bit=true: QLoRA keeps the base in 4 bits with bitsandbytes, which needs "
                              f"a CUDA GPU and this machine has none; use {field}.load_in_4bit=false (plain LoRA)")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise CheckpointError(f"{field}.load_in_4bit=true needs bitsandbytes: pip install 'rlhf-pipeline[gpu]'") from None


def load_kwargs(cfg: LoRAConfig, field: str) -> dict:
    """`from_pretrained` arguments for the base a stage trains on: 4-bit NF4 weights for QLoRA."""
    if not cfg.load_in_4bit:
        return {}
    require_qlora(field)
    from transformers import BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    return {"quantization_config": quant, "device_map": {"": torch.cuda.current_device()}}


def load_for_training(path: str | Path, model_cfg, cfg: LoRAConfig, field: str,
                      precision: str = "fp32") -> tuple[torch.nn.Module, str | None]:
    """The causal LM a stage trains: the whole model, or LoRA adapters on its (for QLoRA, 4-bit) base;
    and the base's signature when it trains adapters. `field` names the config section in errors."""
    from stages.common import checkpoint

    model = checkpoint.load_causal_lm(path, model_cfg, precision, **load_kwargs(cfg, field))
    return prepare(model, cfg, "CAUSAL_LM")


def merged_weights(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """The plain HF state dict behind a peft model's full state dict, adapters merged in: W + scaling·B·A
    for every adapted weight (what a rollout engine loads after each RL update; the model is not touched)."""
    out = {}
    for key, value in state.items():
        if ".lora_" in key or ".original_module." in key:
            continue
        if ".base_layer." in key:
            prefix = key.rsplit(".base_layer.", 1)[0]
            a = state.get(f"{prefix}.lora_A.default.weight")
            if key.endswith(".weight") and a is not None:
                b = state[f"{prefix}.lora_B.default.weight"]
                value = value + (scaling * (b.float() @ a.float())).to(value.dtype)
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        out[name] = value
    return out


def prepare(model: PreTrainedModel, cfg: LoRAConfig, task_type: str) -> tuple[torch.nn.Module, str | None]:
    """`model` wrapped with adapters when `cfg.rank` > 0, and the signature of its base weights."""
    if not cfg.rank:
        return model, None
    signature = base_signature(model)
    if cfg.load_in_4bit:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return apply(model, cfg, task_type), signature


def save_adapter(peft_model, tokenizer: PreTrainedTokenizerBase, out: Path, state_dict: dict | None, signature: str,
                 config_fields: dict | None = None) -> Path:
    """The adapter weights and config (its `base_model_name_or_path` points at the base checkpoint),
    the tokenizer, and `adapter_extra.json`: the base signature and the config fields (e.g. reward
    statistics) the merged model's config must carry."""
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(out)
    extra = {"base_signature": signature, "config_fields": config_fields or {}}
    (out / EXTRA_FILE).write_text(json.dumps(extra, indent=2))
    return out


def read_extra(adapter: Path) -> dict:
    path = Path(adapter) / EXTRA_FILE
    return json.loads(path.read_text()) if path.is_file() else {"config_fields": {}}


def save_trained(model, tokenizer: PreTrainedTokenizerBase, out: Path, state_dict: dict | None, signature: str | None,
                 config_fields: dict | None = None) -> Path:
    """A training stage's model: the adapter when trained with LoRA (`signature` set), else a full
    HF checkpoint with `config_fields` set on its config."""
    from stages.common import checkpoint

    if signature is not None:
        return save_adapter(model, tokenizer, out, state_dict, signature, config_fields)
    for key, value in (config_fields or {}).items():
        setattr(model.config, key, value)
    return checkpoint.save(model, tokenizer, out, state_dict=state_dict)


def trainable_share(model: torch.nn.Module) -> float:
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad) / max(total, 1)
