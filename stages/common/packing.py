"""Padding-free forward passes over right-padded batches (`<stage>.packing`).

`pack` lays a batch's samples end to end in one row, position ids restarting at 0 for each; given
those and no attention mask, transformers keeps every sample to itself (a block-diagonal causal mask
for sdpa and eager, flash-attn's variable-length kernel for flash_attention_2). `unpack` puts each
token's output back where the padded batch has it (zeros at the pads) and `last_tokens` reads each
sample's own last token, so a stage's loss code reads the same tensors either way: the same losses
and gradients as the padded batch, without the compute on pads.

Nothing here imports torch, nor transformers until a model family is checked: the flow's preflight calls `check`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from configs.errors import ConfigError
from stages.common import moe

if TYPE_CHECKING:
    import torch

PACKED_SECTIONS = ("sft", "rm", "prm", "dpo", "rl")  # config sections with a `packing` flag


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The attended tokens of right-padded rows [B, T] as one row [1, N] with `position_ids` that count
    from 0 within each sample (the padded batch's positions)."""
    keep = attention_mask.bool()
    positions = attention_mask.long().cumsum(-1) - 1
    return {"input_ids": input_ids[keep].unsqueeze(0), "position_ids": positions[keep].unsqueeze(0)}


def unpack(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Per-token outputs of a packed row [1, N, ...] in the padded layout [B, T, ...], zeros at the pads
    (in the autograd graph: the gradient flows back to the packed row)."""
    keep = attention_mask.bool()
    out = values.new_zeros((*keep.shape, *values.shape[2:]))
    out[keep] = values[0]
    return out


def last_tokens(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Each sample's output at its own last token, [B, ...], from a packed row [1, N, ...]."""
    ends = attention_mask.long().sum(-1).cumsum(0) - 1
    return values[0, ends]


def inputs(batch: dict[str, torch.Tensor], packed: bool) -> dict[str, torch.Tensor]:
    """A model's token inputs for `batch`'s right-padded `input_ids` / `attention_mask`: as they are, or
    packed into one row."""
    if packed:
        return pack(batch["input_ids"], batch["attention_mask"])
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def router_mask(batch: dict[str, torch.Tensor], packed: bool) -> torch.Tensor | None:
    """The tokens an MoE router loss is taken over (stages.common.moe): a packed row has no pads."""
    return None if packed else batch["attention_mask"]


def logits(model, batch: dict[str, torch.Tensor], packed: bool, aux: list | None = None) -> torch.Tensor:
    """A causal LM's (or token classifier's) logits [B, T, ...] of a right-padded batch, from one padding-free
    row when `packed`. No KV cache: with one, transformers would not derive the per-sample mask from
    the position ids (and nothing is generated from these passes). `aux`: where an MoE model's router
    load-balancing loss is appended (stages.common.moe)."""
    out = model(**inputs(batch, packed), use_cache=False, **moe.router_kwargs(aux))
    moe.record(aux, model, out, router_mask(batch, packed))
    return unpack(out.logits, batch["attention_mask"]) if packed else out.logits


def check(config, field: str) -> None:
    """`field` (a `<stage>.packing` set true) needs a model family whose forward takes position ids, else
    a ConfigError naming it: ALiBi families (Bloom, MPT) take none, and their masks then never see where
    a packed sample starts. `config`: a loaded model config, or config.json as a dict (a family
    transformers does not know, e.g. remote code, is checked by `check_loaded` when it loads)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig

    try:
        loaded = AutoConfig.for_model(config["model_type"]) if isinstance(config, dict) else config
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(loaded)]
    except (KeyError, ValueError):
        return
    require_position_ids(model_class, field)


def check_loaded(model, field: str) -> None:
    """`check` on a loaded model (an HF or peft model): the forward of its backbone."""
    module = model.get_base_model() if hasattr(model, "get_base_model") else model
    require_position_ids(type(getattr(module, getattr(module, "base_model_prefix", ""), module)), field)


def require_position_ids(model_class, field: str) -> None:
    if "position_ids" not in inspect.signature(model_class.forward).parameters:
        raise ConfigError(f"{field}=true: {model_class.__name__} takes no position ids, so the samples of a packed row "
                          f"would attend to each other; set {field}=false")
