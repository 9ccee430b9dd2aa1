"""Turn the pipeline's dataset rows into token ids and loss masks, and pad (or pack) them into batches."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100


def encode_segments(tokenizer: PreTrainedTokenizerBase, texts: list[str], train: list[bool]) -> tuple[list[int], list[int]]:
    """Token ids of the concatenated segments and labels that keep only the trained segments' tokens.

    Segments are tokenized one by one, so a prompt's tokens never merge with its response's:
    the ids trained on are the ids the model sees when it generates after that prompt.
    """
    ids: list[int] = []
    labels: list[int] = []
    for text, trained in zip(texts, train, strict=True):
        seg = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.extend(seg)
        labels.extend(seg if trained else [IGNORE_INDEX] * len(seg))
    return ids, labels


def pad_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad (ids, labels) pairs into `input_ids`, `attention_mask`, `labels` tensors."""
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, labs) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(labs)] = torch.tensor(labs)
        attention_mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def pack_batch(rows: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """(ids, labels) pairs as one padding-free row: the samples end to end, `position_ids` restarting
    at 0 for each (from which transformers builds a mask that keeps every sample to itself), and the
    label of each sample's first token dropped (in a padded batch no token predicts it either)."""
    input_ids: list[int] = []
    labels: list[int] = []
    positions: list[int] = []
    for ids, labs in rows:
        input_ids.extend(ids)
        labels.extend([IGNORE_INDEX, *labs[1:]])
        positions.extend(range(len(ids)))
    as_row = lambda values: torch.tensor([values], dtype=torch.long)  # noqa: E731
    return {"input_ids": as_row(input_ids), "labels": as_row(labels), "position_ids": as_row(positions)}


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the rightmost position whose mask is 1, per row (right or left padding alike)."""
    positions = torch.arange(mask.shape[-1], device=mask.device)
    return (positions * mask.long()).argmax(-1)
