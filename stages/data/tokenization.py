"""Turn the pipeline's dataset rows into token ids and loss masks, and pad (or pack) them into batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100


def decoded(tokenizer: PreTrainedTokenizerBase, ids: list[int], skip_special_tokens: bool = False) -> str:
    """The text of one sequence of ids (transformers types `decode` for a batch too: `str | list[str]`)."""
    return cast(str, tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))


def encode_segments(tokenizer: PreTrainedTokenizerBase, texts: list[str], train: list[bool]) -> tuple[list[int], list[int]]:
    """Token ids of the concatenated segments and labels that keep only the trained segments' tokens.

    Segments are tokenized one by one, so a prompt's tokens never merge with its response's:
    the ids trained on are the ids the model sees when it generates after that prompt.
    """
    segment_ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    ids, mask = segments_with_mask(segment_ids, train)
    return ids, labels_of(ids, mask)


def segments_with_mask(segment_ids: list[list[int]], train: list[bool]) -> tuple[list[int], list[int]]:
    """Tokenized segments end to end, and a mask that is 1 on the tokens of the trained ones."""
    ids: list[int] = []
    mask: list[int] = []
    for seg, trained in zip(segment_ids, train, strict=True):
        ids.extend(seg)
        mask.extend([int(trained)] * len(seg))
    return ids, mask


def labels_of(ids: list[int], mask: list[int]) -> list[int]:
    """Labels for `ids`: the id where the mask is 1, IGNORE_INDEX where it is 0."""
    return [i if m else IGNORE_INDEX for i, m in zip(ids, mask, strict=True)]


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
