"""The datasets data prep writes and the later stages read: each split an Arrow dataset
(`datasets.Dataset.save_to_disk`) that a stage memory-maps, so a rank holds the rows of its batches,
not the set, and no rank tokenizes it again.

    <dataset>/<split>/     the Arrow files: the rendered rows' fields; an SFT row also its `input_ids`
                           and `loss_mask` (1 where the token is trained), tokenized once by data prep
    <dataset>/splits.json  per split: its row count, a digest of its content and its first row's
                           rendered fields (what MLflow's dataset inputs show, read without the Arrow files)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, overload

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from configs.errors import DataError
from stages.data.tokenization import labels_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


MANIFEST = "splits.json"
TOKEN_COLUMNS = ("input_ids", "loss_mask")  # what the SFT-style stages train on
IDS_SUFFIX = "_ids"  # `prompt_ids`, `chosen_ids`, ...: a text field's tokens, for every other dataset
T = TypeVar("T")
READ_BLOCK = 1024  # rows read at a time by a slice of a view
DIGEST_BATCH = 8192  # rows serialized at a time for the digest: a fixed size, so the storage's chunks do not count


def content_digest(ds: datasets.Dataset) -> str:
    """SHA-256 of the rows' values in order, the same however `datasets` chunked them on disk (one
    process or several wrote them)."""
    h = hashlib.sha256()
    table = ds.with_format("arrow")
    for start in range(0, len(ds), DIGEST_BATCH):
        batch = table[start : start + DIGEST_BATCH].combine_chunks().replace_schema_metadata(None)  # `datasets`' info varies
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_table(batch)
        h.update(sink.getvalue())
    return h.hexdigest()


def ids_column(field: str) -> str:
    return field + IDS_SUFFIX


def is_token_column(name: str) -> bool:
    return name in TOKEN_COLUMNS or name.endswith(IDS_SUFFIX)


def save(ds: datasets.Dataset, dataset_dir: Path, split: str) -> dict:
    """`ds` as split `split` of the dataset at `dataset_dir`; returns its manifest entry."""
    ds.save_to_disk(str(dataset_dir / split))
    first = {k: v for k, v in ds[0].items() if not is_token_column(k)} if len(ds) else None
    return {"rows": len(ds), "sha256": content_digest(ds), "first": first}


def write_manifest(dataset_dir: Path, entries: dict[str, dict]) -> None:
    (dataset_dir / MANIFEST).write_text(json.dumps(entries, sort_keys=True) + "\n")


def manifest(dataset_dir: Path) -> dict[str, dict]:
    """The dataset's splits as data prep recorded them ({} for a folder it did not write)."""
    path = Path(dataset_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def load(dataset_dir: Path, split: str) -> datasets.Dataset:
    """The split, memory-mapped (nothing is read until a row is)."""
    folder = Path(dataset_dir) / split
    if not (folder / "state.json").is_file():
        raise DataError(f"{folder}: missing (expected a dataset split written by data prep)")
    return datasets.load_from_disk(str(folder), keep_in_memory=False)


def rows(ds: datasets.Dataset) -> list[dict]:
    """The rendered rows of `ds` as dicts (the token columns left out): for sets read whole."""
    kept = [c for c in ds.column_names if not is_token_column(c)]
    return ds.select_columns(kept).to_list()


def read_split(dataset_dir: Path, split: str) -> list[dict]:
    """The split's rendered rows (prompts, eval rows, preference pairs, ...) as dicts: for sets read whole."""
    return rows(load(dataset_dir, split))


def column(ds: datasets.Dataset, name: str) -> pa.ChunkedArray:
    """Column `name` of every row, as the Arrow buffers it is stored in (memory-mapped: nothing copied)."""
    return ds.select_columns([name]).with_format("arrow")[:][name]


def list_lengths(ds: datasets.Dataset, name: str) -> np.ndarray:
    """Each row's length of the list column `name`, read from the Arrow buffers: checking a million
    rows' lengths makes no Python object per row."""
    return pc.list_value_length(column(ds, name)).to_numpy()


def field_ids(tokenizer: PreTrainedTokenizerBase, row: dict, field: str) -> list[int]:
    """A text field's token ids: data prep's, or for a row made elsewhere (a sample, a test's) tokenized now,
    as data prep tokenizes it (apart from the other fields)."""
    stored = row.get(ids_column(field))
    return stored if stored is not None else tokenizer(row[field], add_special_tokens=False)["input_ids"]


class Indexed(Sequence[T]):
    """A read-only sequence whose item i is `item(i)`, made when it is indexed; a slice is a list."""

    def item(self, i: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        n = len(self)
        if isinstance(index, slice):
            return self.items(*index.indices(n))
        if not -n <= index < n:
            raise IndexError(index)
        return self.item(index % n)

    def items(self, start: int, stop: int, step: int) -> list[T]:
        return [self.item(i) for i in range(start, stop, step)]


class MappedRows(Indexed[T]):
    """`make(row)` of each row of a memory-mapped split, computed as it is indexed: a rank that trains on a
    million rows holds the ones of its micro-batch. `columns` are the ones `make` reads."""

    def __init__(self, ds: datasets.Dataset, columns: tuple[str, ...], make: Callable[[dict], T], what: str = "a split"):
        missing = [c for c in columns if c not in ds.column_names]
        if missing:
            raise DataError(f"{what} without {', '.join(missing)}: written by an older data prep; rerun data_prep")
        self.ds, self.make = ds.select_columns(list(columns)), make

    def __len__(self) -> int:
        return len(self.ds)

    def item(self, i: int) -> T:
        return self.make(self.ds[i])

    def items(self, start: int, stop: int, step: int) -> list[T]:
        if step != 1:
            return super().items(start, stop, step)
        made: list[T] = []
        for first in range(start, stop, READ_BLOCK):  # a read of the Arrow columns per block, not per row
            batch = self.ds[first : min(first + READ_BLOCK, stop)]
            made.extend(self.make(dict(zip(batch, values))) for values in zip(*batch.values()))
        return made

    def __iter__(self) -> Iterator[T]:
        return map(self.make, self.ds)


def row_view(dataset_dir: Path, split: str) -> MappedRows[dict]:
    """The split's rendered rows (no token columns) as dicts, each read as it is indexed: for stages that
    draw some rows of a set (prompts per round), not all."""
    ds = load(dataset_dir, split)
    return MappedRows(ds, tuple(c for c in ds.column_names if not is_token_column(c)), dict, f"{Path(dataset_dir).name}/{split}")


def ids_and_labels(row: dict) -> tuple[list[int], list[int]]:
    return row["input_ids"], labels_of(row["input_ids"], row["loss_mask"])


def token_rows(dataset_dir: Path, split: str) -> MappedRows[tuple[list[int], list[int]]]:
    """An SFT split as (input ids, labels) pairs."""
    return MappedRows(load(dataset_dir, split), TOKEN_COLUMNS, ids_and_labels, "an SFT split")
