"""Real datasets through HF `datasets`: hub names, local json/jsonl/parquet/csv files, `json@DIR`
folders; key mapping, `max_samples`, train/eval split and mixing with probabilities."""

from __future__ import annotations

from pathlib import Path

import datasets
from datasets import Dataset

from configs.errors import DataError
from configs.schema import DatasetConfig

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def file_columns(section: str, cfg: DatasetConfig) -> dict[str, str]:
    """Config field -> column each dataset kind reads."""
    if section == "sft":
        return {"input_key": cfg.input_key} if cfg.multiturn else {"input_key": cfg.input_key, "output_key": cfg.output_key}
    if section == "preference":
        cols = {"chosen_key": cfg.chosen_key, "rejected_key": cfg.rejected_key}
        if cfg.margin_key:
            cols["margin_key"] = cfg.margin_key
        return cols
    return {"input_key": cfg.input_key, "label_key": cfg.label_key}


def is_local(path: str) -> bool:
    """A source read from this machine (a file, a `json@` folder), not a hub dataset name."""
    return path.startswith("json@") or Path(path).expanduser().exists() or Path(path).suffix in FILE_BUILDERS


def load_source(path: str, split: str, subset: str | None = None) -> Dataset:
    """One source as a `Dataset` (`subset`: a hub dataset's config name); a missing file or an
    unreachable hub name is a one-line DataError."""
    if path.startswith("json@"):
        folder = Path(path.removeprefix("json@")).expanduser()
        files = sorted(str(p) for p in folder.glob("*.json*")) if folder.is_dir() else []
        if not files:
            raise DataError(f"{path}: no .json/.jsonl files in {folder}")
        return _load("json", path, data_files=files, split=split)  # files are split "train"
    local = Path(path).expanduser()
    if local.suffix in FILE_BUILDERS:
        if not local.is_file():
            raise DataError(f"{path}: no such file")
        if local.stat().st_size == 0:
            raise DataError(f"{path}: file is empty")
        return _load(FILE_BUILDERS[local.suffix], path, data_files=str(local), split=split)
    if local.is_dir():
        if any((local / f).is_file() for f in ("dataset_info.json", "state.json", "dataset_dict.json")):
            try:
                loaded = datasets.load_from_disk(str(local))
            except Exception as exc:
                raise DataError(f"{path}: cannot load dataset saved with save_to_disk ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})") from exc
            if not isinstance(loaded, datasets.DatasetDict):
                if split != "train":  # one saved Dataset is one split; reusing it would leak train rows into eval
                    raise DataError(f"{path}: a saved Dataset has only the 'train' split, not {split!r}")
                return loaded
            if split not in loaded:
                raise DataError(f"{path}: no split {split!r}; splits are: {', '.join(loaded)}")
            return loaded[split]
        return _load(str(local), path, split=split)
    return _load(path, path, split=split, **({"name": subset} if subset else {}))


def _load(builder: str, shown: str, **kwargs) -> Dataset:
    try:
        return datasets.load_dataset(builder, **kwargs)
    except Exception as exc:  # datasets raises many types (FileNotFound, ConnectionError, ValueError, ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{shown}: cannot load dataset ({first})") from exc


def require_columns(ds: Dataset, source: str, needed: dict[str, str]) -> None:
    """`needed` maps a config field (e.g. `data.sft.input_key`) to the column it names."""
    for field, column in needed.items():
        if column not in ds.column_names:
            raise DataError(f"{source}: missing column {column!r} (set by {field}); columns are: {', '.join(ds.column_names)}")


def load_mixed(
    cfg: DatasetConfig, section: str, columns: dict[str, str], seed: int, optional: list[str] = ()
) -> tuple[Dataset, Dataset]:
    """Train and eval splits of every source, reduced to `columns` (config field -> column, required)
    and the `optional` columns a source has, then mixed.

    Mixing follows `probs` with `interleave_datasets` (until every source is exhausted), as OpenRLHF's
    `--dataset_probs` does; without `probs` the sources are concatenated.
    """
    trains, evals = [], []
    for path in cfg.paths:
        ds = load_source(path, cfg.split, cfg.subset)
        needed = {f"data.{section}.{field}": col for field, col in columns.items()}
        require_columns(ds, path, needed)
        keep = list(dict.fromkeys([*columns.values(), *(c for c in optional if c in ds.column_names)]))
        ds = ds.select_columns(keep)
        if len(ds) == 0:
            raise DataError(f"{path}: dataset is empty (split {cfg.split!r})")
        if cfg.max_samples is not None:
            ds = ds.select(range(min(cfg.max_samples, len(ds))))
        if cfg.eval_split is not None:
            ev = load_source(path, cfg.eval_split, cfg.subset)
            require_columns(ev, f"{path} (split {cfg.eval_split!r})", needed)
            ev = ev.select_columns([c for c in ds.column_names if c in ev.column_names])
        elif cfg.eval_ratio > 0 and len(ds) > 1:
            parts = ds.train_test_split(test_size=cfg.eval_ratio, seed=seed)
            ds, ev = parts["train"], parts["test"]
        else:
            ev = ds.select([])
        trains.append(ds)
        evals.append(ev)
    try:
        return _mix(trains, cfg.probs, seed), datasets.concatenate_datasets(evals)
    except ValueError as exc:  # e.g. a column that is text in one source and a number in another
        raise DataError(f"data.{section}: cannot mix {', '.join(cfg.paths)} ({str(exc).splitlines()[0]})") from exc


def _mix(parts: list[Dataset], probs: list[float] | None, seed: int) -> Dataset:
    if len(parts) == 1:
        return parts[0]
    if probs is None:
        return datasets.concatenate_datasets(parts)
    total = sum(probs)
    return datasets.interleave_datasets(
        parts, probabilities=[p / total for p in probs], seed=seed, stopping_strategy="all_exhausted"
    )
