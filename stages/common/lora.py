"""LoRA adapters with peft for the training stages: wrap a model, save only the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from configs.schema import LoRAConfig

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def apply(model: torch.nn.Module, cfg: LoRAConfig, task_type: str) -> torch.nn.Module:
    """`model` with LoRA adapters on `cfg.target_modules`; for SEQ_CLS peft also trains the score head."""
    from peft import LoraConfig, get_peft_model

    peft_cfg = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules, task_type=task_type,
    )
    return get_peft_model(model, peft_cfg)


def save_adapter(peft_model, tokenizer, out: Path, state_dict: dict | None, extra: dict | None = None) -> Path:
    """The adapter weights and config (its `base_model_name_or_path` points at the base checkpoint),
    the tokenizer, and `extra` (e.g. reward statistics) as `adapter_extra.json`."""
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if extra:
        (out / "adapter_extra.json").write_text(json.dumps(extra, indent=2))
    return out


def trainable_share(model: torch.nn.Module) -> float:
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad) / max(total, 1)
