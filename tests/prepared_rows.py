"""Data prep's datasets as lists of rendered rows, for tests that compare rows with what they expect."""

from __future__ import annotations

from stages.data import prepared as prepared_data
from stages.data_prep import stage as data_prep


def as_rows(out: dict) -> dict[str, dict[str, list[dict]]]:
    """`{name: {split: Dataset}}` -> the same with each split's rendered rows (token columns left out)."""
    return {name: {split: prepared_data.rows(ds) for split, ds in splits.items()} for name, splits in out.items()}


def file_rows(cfg, tokenizer, dropped: dict[str, int] | None = None) -> dict[str, dict[str, list[dict]]]:
    return as_rows(data_prep.file_datasets(cfg, tokenizer, dropped))
