"""Rows that share a prompt, computed as one row (`rl.shared_prompt`).

A GRPO-style rollout has n samples of each prompt. Padded, each sample is its own row and the
prompt's tokens go through the model n times. Here the samples of one prompt become one row: the
prompt once, then each response, a response's position ids restarting where the prompt ends and a 4D
attention mask letting each response token see the prompt and its own response only. The model's
outputs are then put back in the padded layout [B, T, ...] (each sample's prompt positions read the
shared prompt's outputs; zeros at the pads), so the loss code reads the same tensors as with padded
rows: the same losses, and the same gradients (the shared prompt gets the sum of its samples').

Which rows share: those whose first `prefix` tokens are identical, `prefix` being each row's own
split point (any split is exact; RL splits where the sampled tokens begin). Rows need not be adjacent.

The layout needs an attention that takes a 4D mask (SDPA, eager) and no sliding window (its mask is
built from positions in the row, which the restarting position ids no longer are): `supported`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASKED_ATTENTION = ("sdpa", "eager")  # flash_attention_2 takes no 4D mask


def attention_window(config) -> int | None:
    """The span a sliding-window layer attends over; None when every layer sees the whole sequence
    (0: some other local attention)."""
    types = getattr(config, "layer_types", None)
    if types is not None and all(t == "full_attention" for t in types):
        return None
    window = getattr(config, "sliding_window", None)
    return 0 if types is not None and window is None else window


def supported(model) -> bool:
    """Whether `model` (an HF or peft model, or a DeepSpeed engine around one) can run shared rows."""
    config = getattr(model, "module", model).config
    return config._attn_implementation in MASKED_ATTENTION and attention_window(config) is None


@dataclass
class SharedRows:
    """One row per prompt: `input_ids` / `position_ids` [G, W], `mask` [G, 1, W, W] (True: may attend),
    and where each padded position (b, t) reads its output: `row` [B], `col` [B, T], `real` [B, T]."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    real: torch.Tensor

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as SDPA and eager attention both take it: 0 where attended, the dtype's minimum elsewhere."""
        out = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
        return out.masked_fill_(~self.mask, torch.finfo(dtype).min)

    def to_padded(self, values: torch.Tensor) -> torch.Tensor:
        """Per-token outputs of the shared rows [G, W, ...] in the padded layout [B, T, ...], zeros at the
        pads (in the autograd graph: each prompt position's gradient is the sum of its samples')."""
        out = values[self.row[:, None], self.col]
        real = self.real.view(*self.real.shape, *[1] * (values.dim() - 2))
        return out * real.to(out.dtype)


def layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: torch.Tensor) -> SharedRows:
    """Right-padded rows [B, T] as shared rows: rows whose first `prefix[b]` tokens match share them."""
    lengths = attention_mask.long().sum(-1).tolist()
    shared = [min(int(p), n) for p, n in zip(prefix.tolist(), lengths)]
    ids = input_ids.tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for b, (row, p) in enumerate(zip(ids, shared)):
        groups.setdefault(tuple(row[:p]), []).append(b)
    width = max(len(key) + sum(lengths[b] - shared[b] for b in members) for key, members in groups.items())
    g_count, (b_count, t_count) = len(groups), input_ids.shape
    shared_ids = torch.zeros((g_count, width), dtype=input_ids.dtype)
    positions = torch.zeros((g_count, width), dtype=torch.long)
    mask = torch.zeros((g_count, 1, width, width), dtype=torch.bool)
    row = torch.zeros(b_count, dtype=torch.long)
    col = torch.zeros((b_count, t_count), dtype=torch.long)
    real = torch.zeros((b_count, t_count), dtype=torch.bool)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    for g, (key, members) in enumerate(groups.items()):
        p = len(key)
        shared_ids[g, :p] = torch.tensor(key, dtype=input_ids.dtype)
        positions[g, :p] = torch.arange(p)
        mask[g, 0, :p, :p] = causal[:p, :p]
        start = p
        for b in members:
            r = lengths[b] - p
            end = start + r
            shared_ids[g, start:end] = input_ids[b, p : lengths[b]]
            positions[g, start:end] = torch.arange(p, p + r)
            mask[g, 0, start:end, :p] = True
            mask[g, 0, start:end, start:end] = causal[:r, :r]
            row[b] = g
            col[b, :p] = torch.arange(p)
            col[b, p : lengths[b]] = torch.arange(start, end)
            real[b, : lengths[b]] = True
            start = end
        pads = torch.arange(start, width)
        mask[g, 0, pads, pads] = True  # a pad sees itself: a row of nothing but masked keys gives NaNs
    device = input_ids.device
    return SharedRows(shared_ids.to(device), positions.to(device), mask.to(device), row.to(device), col.to(device),
                      real.to(device))


def logits(model, batch: dict[str, torch.Tensor], prefix: torch.Tensor) -> torch.Tensor:
    """A causal LM's (or token classifier's) outputs [B, T, ...] for the right-padded `batch`, computed
    over shared rows (`layout`). No KV cache: nothing is generated from these passes."""
    rows = layout(batch["input_ids"], batch["attention_mask"], prefix)
    dtype = next(iter(model.parameters())).dtype
    out = model(input_ids=rows.input_ids, position_ids=rows.position_ids, attention_mask=rows.additive_mask(dtype),
                use_cache=False)
    return rows.to_padded(out.logits)
