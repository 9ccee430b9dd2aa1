"""Real datasets through HF `datasets`: hub names, local json/jsonl/parquet/csv files, `json@DIR`
folders and dataset folders; key mapping, `max_samples`, train/eval split and mixing with probabilities.

A data error names the file the user wrote and the line in it (JSON Lines, CSV) or the row (parquet,
a JSON array; a hub or saved dataset's split): values are checked per source before any split or
mix, and each row carries its origin (`ORIGIN_COLUMNS`) through both for the checks made later.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import functools
import io
import json
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import datasets
import numpy as np
from datasets import Dataset

from configs.errors import DataError, first_line
from configs.schema import DatasetConfig
from stages.data import values as data_values

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
TEXT_BUILDERS = ("json", "csv")  # read as text: must be UTF-8
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # a folder written by `save_to_disk`
SOURCE_COLUMN, ROW_COLUMN = "__source__", "__row__"  # index into `sources(cfg)`; 0-based row of that source
ORIGIN_COLUMNS = (SOURCE_COLUMN, ROW_COLUMN)
CHECK_BATCH = 1000  # rows decoded at a time by `check_values`
PREVIEW_ROWS = 1000  # rows of each local source the driver checks before any work (data prep checks them all)
READ_CHUNK = 1 << 24  # bytes decoded at a time by `check_text`


def file_columns(section: str, cfg: DatasetConfig, pretrain: bool = False) -> dict[str, str]:
    """Config field -> column each dataset kind reads (`pretrain`: sft.pretrain_mode's plain text, one column)."""
    if section == "sft":
        if cfg.multiturn or pretrain:
            return {"input_key": cfg.input_key}
        return {"input_key": cfg.input_key, "output_key": cfg.output_key}
    if section == "preference":
        if cfg.unpaired:  # OpenRLHF's KTO rows: one response and whether it is desirable
            return {"output_key": cfg.output_key, "label_key": cfg.label_key}
        cols = {"chosen_key": cfg.chosen_key, "rejected_key": cfg.rejected_key}
        if cfg.margin_key:
            cols["margin_key"] = cfg.margin_key
        return cols
    return {"input_key": cfg.input_key, "label_key": cfg.label_key}


def optional_columns(section: str, cfg: DatasetConfig) -> dict[str, str]:
    """Config field -> column read where a source has it: conversation-style responses carry their
    prompt, so preference data may lack the prompt column."""
    return {"input_key": cfg.input_key} if section == "preference" else {}


def is_local(path: str) -> bool:
    """A source read from this machine (a file, a `json@` folder), not a hub dataset name."""
    return path.startswith("json@") or Path(path).expanduser().exists() or Path(path).suffix in FILE_BUILDERS


def sources(cfg: DatasetConfig) -> list[tuple[str, str]]:
    """(path, split) of every source a row can come from; `SOURCE_COLUMN` indexes this list."""
    eval_sources = [(path, cfg.eval_split) for path in cfg.paths] if cfg.eval_split is not None else []
    return [(path, cfg.split) for path in cfg.paths] + eval_sources


# --- loading -------------------------------------------------------------------------------------


def load_source(path: str, split: str, subset: str | None = None, paths_key: str = "paths",
                first: int | None = None) -> Dataset:
    """One source as a `Dataset` (`subset`: a hub dataset's config name); a missing, empty, non-UTF-8
    or malformed file or an unreachable hub name is a one-line DataError (`paths_key`: the config key
    that lists the source, for what to do). With `first`: its first `first` rows, at a cost that does not
    grow with the files (`first_rows`; the driver's check before any work)."""
    local = Path(path).expanduser()
    if _is_saved(local):
        saved = _load_saved(path, local, split)
        return saved if first is None else saved.select(range(min(first, len(saved))))
    found = local_files(path, split, subset)
    if found is None:  # a hub name, or a folder HF `datasets` reads by itself
        name = str(local) if local.is_dir() else path
        return _load(name, path, split=split, **({"name": subset} if subset else {}))
    builder, files = found
    for file in files:
        if builder in TEXT_BUILDERS:
            check_text(file, paths_key, whole=first is None)
        elif file.stat().st_size == 0:
            raise _empty(file, paths_key)
    strings = _csv_strings(files[0]) if builder == "csv" else None
    with contextlib.ExitStack() as scratch_dir:
        try:  # the files of a split, in order, are its rows ("train" is what data_files become)
            read, options = files, {}
            if first is not None:  # a scratch copy of the first rows, read in memory and dropped
                scratch = scratch_dir.enter_context(tempfile.TemporaryDirectory(prefix="rlhf-first-rows-"))
                read = first_rows(builder, files, first, Path(scratch), paths_key)
                options = {"cache_dir": scratch, "keep_in_memory": True}
            with quiet():
                return datasets.load_dataset(builder, data_files=[str(f) for f in read], split="train",
                                             **({"features": strings} if strings else {}), **options)
        except DataError:
            raise
        except Exception as exc:  # datasets raises many types (ValueError, ArrowInvalid, DatasetGenerationError, ...)
            malformed = next(filter(None, map(json_problem, files)), None) if builder == "json" else None
            if malformed:
                raise DataError(malformed) from exc
            reason = _reason(exc)
            if "corresponds to no data" in reason:
                raise DataError(f"{path}: no rows; add rows or remove it from {paths_key}") from exc
            raise DataError(f"{path}: cannot load dataset ({reason})") from exc


def first_rows(builder: str, files: list[Path], rows: int, scratch: Path, paths_key: str) -> list[Path]:
    """Copies into `scratch` of the first `rows` rows of `files`, in the same format, for the same builder to
    read as it reads the whole: JSON Lines by lines and CSV by records, as written (so a row's line is its
    line in the user's file), parquet by batches. A JSON document that is not JSON Lines (an array) cannot
    be cut: it is read whole."""
    copies, left = [], rows
    for i, file in enumerate(files):
        if left <= 0:
            break
        copy = scratch / f"{i}{file.suffix}"
        try:
            if builder == "parquet":
                left -= _first_batch(file, copy, left)
            elif builder == "csv":
                left -= _first_records(file, copy, left)
            elif _is_json_lines(file):
                left -= _first_lines(file, copy, left)
            else:
                return files
        except UnicodeDecodeError:
            check_text(file, paths_key)  # past the first chunk: its one line names the byte
            raise
        copies.append(copy)
    return copies


def _is_json_lines(file: Path) -> bool:
    with open(file, encoding="utf-8-sig") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def _first_lines(file: Path, copy: Path, rows: int) -> int:
    """The file's lines up to its `rows`-th non-blank one (a row each), copied; how many rows that is."""
    found = 0
    with open(file, encoding="utf-8-sig") as src, open(copy, "w", encoding="utf-8") as dst:
        for line in src:
            dst.write(line)
            found += bool(line.strip())
            if found == rows:
                break
    return found


def _first_records(file: Path, copy: Path, rows: int) -> int:
    """The header and the first `rows` records (a quoted field may span lines; blank lines hold none), copied."""
    kept: list[str] = []
    found = -1  # the header is no row

    def lines(src: Iterator[str]) -> Iterator[str]:
        for line in src:
            kept.append(line)
            yield line

    with open(file, encoding="utf-8-sig", newline="") as src:
        for record in csv.reader(lines(src)):
            found += bool(record)
            if found == rows:
                break
    copy.write_text("".join(kept), encoding="utf-8", newline="")
    return max(found, 0)


def _first_batch(file: Path, copy: Path, rows: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(file)
    batch = next(parquet.iter_batches(batch_size=rows), None)
    pq.write_table(pa.Table.from_batches([batch]) if batch is not None else parquet.schema_arrow.empty_table(), copy)
    return 0 if batch is None else batch.num_rows


def local_files(path: str, split: str, subset: str | None = None) -> tuple[str, list[Path]] | None:
    """The builder and the files, in row order, of a local source's split: a json/jsonl/parquet/csv
    file (one split, "train"), a `json@DIR` folder (its .json/.jsonl files, one split) or a folder of
    data files (splits by file name, as HF `datasets` finds them); None for a hub name, a folder saved
    with `save_to_disk` or one of another format."""
    if path.startswith("json@"):
        folder = Path(path.removeprefix("json@")).expanduser()
        files = sorted(folder.glob("*.json*")) if folder.is_dir() else []
        if not files:
            raise DataError(f"{path}: no .json/.jsonl files in {folder}")
        _require_train(path, split, "a json@ folder")
        return "json", files
    local = Path(path).expanduser()
    if local.suffix in FILE_BUILDERS:
        if not local.is_file():
            raise DataError(f"{path}: no such file")
        _require_train(path, split, "a single file")
        return FILE_BUILDERS[local.suffix], [local]
    if not local.is_dir() or _is_saved(local):
        return None
    try:
        builder = datasets.load_dataset_builder(str(local), **({"name": subset} if subset else {}))
    except Exception as exc:
        raise DataError(f"{path}: cannot load dataset ({_reason(exc)})") from exc
    if builder.name not in FILE_BUILDERS.values():
        return None
    splits = {str(name): files for name, files in (builder.config.data_files or {}).items()}
    if split not in splits:
        raise DataError(f"{path}: no split {split!r}; splits are: {', '.join(splits)}")
    return builder.name, [Path(f) for f in splits[split]]


def _require_train(path: str, split: str, what: str) -> None:
    if split != "train":
        raise DataError(f"{path}: {what} is one split, 'train', not {split!r}; use eval_ratio instead of "
                        f"eval_split, or a folder with a {split} file")


def _is_saved(local: Path) -> bool:
    return local.is_dir() and any((local / marker).is_file() for marker in SAVED_MARKERS)


def _load_saved(path: str, local: Path, split: str) -> Dataset:
    try:
        loaded = datasets.load_from_disk(str(local))
    except Exception as exc:
        raise DataError(f"{path}: cannot load dataset saved with save_to_disk ({type(exc).__name__}: {first_line(exc)})") from exc
    if not isinstance(loaded, datasets.DatasetDict):
        if split != "train":  # one saved Dataset is one split; reusing it would leak train rows into eval
            raise DataError(f"{path}: a saved Dataset has only the 'train' split, not {split!r}")
        return loaded
    if split not in loaded:
        raise DataError(f"{path}: no split {split!r}; splits are: {', '.join(loaded)}")
    return loaded[split]


def _load(builder: str, shown: str, **kwargs) -> Dataset:
    try:
        with quiet():
            return datasets.load_dataset(builder, **kwargs)
    except Exception as exc:  # datasets raises many types (FileNotFound, ConnectionError, ValueError, ...)
        raise DataError(f"{shown}: cannot load dataset ({_reason(exc)})") from exc


@contextmanager
def quiet() -> Iterator[None]:
    """HF `datasets` logs the error of a file it cannot parse before raising it: the DataError made
    of it is the one line the user sees. Its progress bars are off meanwhile (a stage prints its own lines)."""
    level = datasets.utils.logging.get_verbosity()
    bars = datasets.is_progress_bar_enabled()
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.utils.logging.set_verbosity(level)
        if bars:
            datasets.enable_progress_bars()


def _reason(exc: BaseException) -> str:
    """The first line of what went wrong: for "An error occurred while generating the dataset", its cause."""
    if isinstance(exc, datasets.exceptions.DatasetGenerationError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return first_line(exc)


def _csv_strings(file: Path) -> datasets.Features | None:
    """Every column of a CSV file as text: CSV has no types, and a guessed one changes what the user
    wrote (a label `1.50` read as the number 1.5)."""
    with open(file, encoding="utf-8-sig", newline="") as f:
        header = next(csv.reader(f), [])
    if not header or not all(header) or len(set(header)) != len(header):
        return None  # pandas renames blank and repeated names: leave those to it
    return datasets.Features({name: datasets.Value("string") for name in header})


# --- checking a file's text ----------------------------------------------------------------------


def check_text(file: Path, paths_key: str = "paths", whole: bool = True) -> None:
    """A text data file is UTF-8 and not blank; the error names the line and byte offset of the first
    byte that is not UTF-8. Decoded in chunks, in C: cheap next to loading the file (`whole=False`: its
    first chunk only, for a check of its first rows)."""
    base, newlines, blank, pending = 0, 0, True, b""
    with open(file, "rb") as f:
        while True:
            chunk = f.read(READ_CHUNK)
            data = pending + chunk
            try:
                text, used = codecs.utf_8_decode(data, "strict", not chunk)
            except UnicodeDecodeError as exc:
                line = newlines + data.count(b"\n", 0, exc.start) + 1
                raise DataError(f"{file} line {line}: byte 0x{data[exc.start]:02x} at offset {base + exc.start} is not "
                                f"UTF-8 text; re-encode the file as UTF-8 (e.g. iconv -f <its encoding> -t UTF-8)") from None
            newlines += data.count(b"\n", 0, used)
            blank = blank and not text.strip()
            base, pending = base + used, data[used:]
            if not chunk:
                break
            if not whole:
                return
    if blank:
        raise _empty(file, paths_key)


def _empty(file: Path, paths_key: str) -> DataError:
    return DataError(f"{file}: file is empty; add rows or remove it from {paths_key}")


def json_problem(file: Path) -> str | None:
    """The first line of a .json/.jsonl file that is not valid JSON or not an object of named fields
    (HF `datasets` tells only a byte position, or nothing); None when every row is one."""
    text = file.read_text(encoding="utf-8-sig")
    try:  # one JSON document: an array of rows, or one row
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":  # "Extra data": a first line that is whole, so JSON Lines
            return f"{file} line {exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}); fix the JSON there"
    else:
        rows = document if isinstance(document, list) else [document]
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
        if bad is None:
            return None
        return (f"{file} row {bad + 1}: {data_values.describe(rows[bad])}, not a JSON object; "
                "each row must be one object of named fields")
    for number, line in enumerate(text.split("\n"), 1):  # JSON strings may hold other line breaks
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"{file} line {number}: not valid JSON ({exc.msg} at column {exc.colno}); fix or remove that line"
        if not isinstance(row, dict):
            return (f"{file} line {number}: {data_values.describe(row)}, not a JSON object; "
                    "each line must be one object of named fields")
    return None


# --- where a row came from -----------------------------------------------------------------------


def where(path: str, split: str, subset: str | None, row: int) -> str:
    """Row `row` (0-based) of a source's split as the user finds it: `FILE line N` (JSON Lines, CSV),
    `FILE row N` (parquet, a JSON array) or, for a hub or saved dataset, `NAME (split 'S') row N`.
    Only called for an error, so the files are read again here rather than tracked while loading."""
    found = None if _is_saved(Path(path).expanduser()) else local_files(path, split, subset)
    if found is not None:
        builder, files = found
        left = row
        for file in files:
            unit, numbers = _row_numbers(file, builder)
            if left < len(numbers):
                return f"{file} {unit} {numbers[left]}"
            left -= len(numbers)
    return f"{path} (split {split!r}) row {row + 1}"


def locate(cfg: DatasetConfig, row: dict) -> str:
    """`where` for a row of `load_mixed`'s datasets, from its origin columns."""
    path, split = sources(cfg)[row[SOURCE_COLUMN]]
    return where(path, split, cfg.subset, row[ROW_COLUMN])


def _row_numbers(file: Path, builder: str) -> tuple[str, Sequence[int]]:
    """("line", the line each row starts on) or ("row", 1..n), as HF `datasets` reads the file."""
    if builder == "parquet":
        import pyarrow.parquet as pq

        return "row", range(1, pq.ParquetFile(file).metadata.num_rows + 1)
    text = file.read_text(encoding="utf-8-sig")
    if builder == "csv":  # a quoted field may span lines; blank lines hold no row
        reader = csv.reader(io.StringIO(text, newline=""))
        next(reader, None)  # the header
        starts, end = [], reader.line_num
        for record in reader:
            if record:
                starts.append(end + 1)
            end = reader.line_num
        return "line", starts
    if text.lstrip().startswith("["):
        return "row", range(1, len(json.loads(text)) + 1)
    return "line", [number for number, line in enumerate(text.split("\n"), 1) if line.strip()]


def with_origin(ds: Dataset, source: int) -> Dataset:
    ds = ds.add_column(SOURCE_COLUMN, np.full(len(ds), source, dtype=np.int32))
    return ds.add_column(ROW_COLUMN, np.arange(len(ds), dtype=np.int64))


# --- checking values -----------------------------------------------------------------------------


def require_columns(ds: Dataset, source: str, needed: dict[str, str]) -> None:
    """`needed` maps a config field (e.g. `data.sft.input_key`) to the column it names."""
    for field, column in needed.items():
        if column not in ds.column_names:
            raise DataError(f"{source}: missing column {column!r} (set by {field}); columns are: "
                            f"{', '.join(ds.column_names)}; set {field} to the one that holds it")


def check_values(ds: Dataset, section: str, cfg: DatasetConfig, fields: dict[str, str], located: Callable[[int], str],
                 pretrain: bool = False) -> None:
    """Every value of the columns `fields` (config field -> column) holds what its field reads (see
    `data_values`); the error names the row `located(i)` and the column, its key and what to do."""
    kinds = data_values.value_kinds(section, cfg, pretrain)
    required = file_columns(section, cfg, pretrain)
    for start in range(0, len(ds), CHECK_BATCH):
        try:
            batch = ds[start : start + CHECK_BATCH]
        except UnicodeDecodeError:  # a parquet or saved dataset's text column holding other bytes
            bad = next(i for i in range(start, min(start + CHECK_BATCH, len(ds))) if not _decodes(ds, i))
            raise DataError(f"{located(bad)}: text that is not UTF-8; re-encode the data as UTF-8") from None
        for field, column in fields.items():
            for k, value in enumerate(batch[column]):
                problem = data_values.problem(value, kinds[field], required=field in required)
                if problem:
                    raise DataError(f"{located(start + k)}: {column!r} (data.{section}.{field}) {problem}")


def _decodes(ds: Dataset, i: int) -> bool:
    try:
        ds[i]
    except UnicodeDecodeError:
        return False
    return True


# --- the train and eval splits of a dataset config -----------------------------------------------


def checked_source(cfg: DatasetConfig, section: str, columns: dict[str, str], path: str, pretrain: bool = False,
                   first: int | None = None) -> tuple[Dataset, Dataset | None]:
    """One source's `split` (and its `eval_split`, None without one): its first `first` rows or all, reduced to
    `columns` (config field -> column, required) and the `optional_columns` it has, cut to `max_samples`, its
    values checked (`pretrain`: as plain text). One-line errors name the file, split and key."""
    needed = {f"data.{section}.{field}": col for field, col in columns.items()}
    paths_key = f"data.{section}.paths"
    ds = load_source(path, cfg.split, cfg.subset, paths_key, first=first)
    require_columns(ds, path, needed)
    fields = {**columns, **{f: c for f, c in optional_columns(section, cfg).items() if c in ds.column_names}}
    ds = ds.select_columns(list(dict.fromkeys(fields.values())))
    if len(ds) == 0:
        raise DataError(f"{path}: dataset is empty (split {cfg.split!r}); add rows or remove it from {paths_key}")
    if cfg.max_samples is not None:
        ds = ds.select(range(min(cfg.max_samples, len(ds))))
    check_values(ds, section, cfg, fields, functools.partial(where, path, cfg.split, cfg.subset), pretrain)
    if cfg.eval_split is None:
        return ds, None
    ev = load_source(path, cfg.eval_split, cfg.subset, paths_key, first=first)
    require_columns(ev, f"{path} (split {cfg.eval_split!r})", needed)
    ev_fields = {f: c for f, c in fields.items() if c in ev.column_names}
    ev = ev.select_columns(list(dict.fromkeys(ev_fields.values())))
    check_values(ev, section, cfg, ev_fields, functools.partial(where, path, cfg.eval_split, cfg.subset), pretrain)
    return ds, ev


def load_mixed(cfg: DatasetConfig, section: str, columns: dict[str, str], seed: int,
               pretrain: bool = False) -> tuple[Dataset, Dataset]:
    """Train and eval splits of every source (`checked_source`), mixed. Each row also holds `ORIGIN_COLUMNS`,
    for `locate`.

    Mixing follows `probs` with `interleave_datasets` (until every source is exhausted), as OpenRLHF's
    `--dataset_probs` does; without `probs` the sources are concatenated.
    """
    trains, evals = [], []
    for index, path in enumerate(cfg.paths):
        ds, ev = checked_source(cfg, section, columns, path, pretrain)
        ds = with_origin(ds, index)
        if ev is not None:
            ev = with_origin(ev, len(cfg.paths) + index)
        elif held_out := held_out_rows(len(ds), cfg.eval_ratio, math.ceil(cfg.eval_min_rows / len(cfg.paths))):
            parts = ds.train_test_split(test_size=held_out, seed=seed)
            ds, ev = parts["train"], parts["test"]
        else:
            ev = ds.select([])
        trains.append(ds)
        evals.append(ev)
    try:
        return _mix(trains, cfg.probs, seed), datasets.concatenate_datasets(evals)
    except ValueError as exc:  # e.g. a column that is text in one source and a number in another
        raise DataError(f"data.{section}: cannot mix {', '.join(cfg.paths)} ({str(exc).splitlines()[0]})") from exc


def held_out_rows(n: int, ratio: float, min_rows: int) -> int:
    """Rows of an `n`-row source held out for eval: `ratio` of them, at least `min_rows` (a ratio alone
    leaves 10 of 200 prompts, too few to compare models), at most a fifth of the source, none with ratio 0."""
    if ratio <= 0 or n < 2:
        return 0
    return max(1, min(max(math.ceil(ratio * n), min_rows), max(n // 5, math.ceil(ratio * n)), n - 1))


def holds_out(data, section: str) -> bool:
    """Whether the section holds rows out for eval: not data.eval_prompts (every row of its split is held out),
    nor data.prompts beside it (every row trains)."""
    return not (section == "eval_prompts" or (section == "prompts" and data.eval_prompts is not None))


def as_read(data, section: str) -> DatasetConfig:
    """The section's dataset as data prep reads it: one that holds nothing out reads its `split` whole."""
    ds_cfg: DatasetConfig = getattr(data, section)
    if holds_out(data, section):
        return ds_cfg
    return ds_cfg.model_copy(update={"eval_split": None, "eval_ratio": 0.0, "eval_min_rows": 0})


def require_eval(section: str, cfg: DatasetConfig, train_rows: int, eval_rows: int, counted_all: bool = True) -> None:
    """Every dataset has eval rows (later stages evaluate on them); the error says which key to set
    (`counted_all`: False where only the first rows were read)."""
    if eval_rows == 0:
        counted = f"{train_rows}{'' if counted_all else '+'} row{'' if train_rows == 1 and counted_all else 's'}"
        raise DataError(
            f"data.{section}: no rows held out for eval (eval_ratio={cfg.eval_ratio} of {counted}); set "
            f"data.{section}.eval_ratio above 0 or data.{section}.eval_split (holding rows out needs at least 2)"
        )


def check_first_rows(cfg: DatasetConfig, section: str, columns: dict[str, str], holds_out: bool,
                     pretrain: bool = False, rows: int = PREVIEW_ROWS) -> None:
    """What `load_mixed` and `require_eval` check, on the first `rows` rows of each source's splits: the
    columns, their values and, where the section `holds_out` eval rows, that some are held out. The driver
    checks this before any work starts, at a cost that does not grow with the files; data prep checks
    every row."""
    seen, held, counted_all = 0, 0, True
    for path in cfg.paths:
        ds, ev = checked_source(cfg, section, columns, path, pretrain, first=rows)
        seen += len(ds)
        counted_all = counted_all and len(ds) < rows
        # at least 2 rows of a source with eval_ratio > 0 hold some out: its first rows tell
        held += len(ev) if ev is not None else held_out_rows(len(ds), cfg.eval_ratio,
                                                               math.ceil(cfg.eval_min_rows / len(cfg.paths)))
    if holds_out:
        require_eval(section, cfg, seen, held, counted_all)


def _mix(parts: list[Dataset], probs: list[float] | None, seed: int) -> Dataset:
    if len(parts) == 1:
        return parts[0]
    if probs is None:
        return datasets.concatenate_datasets(parts)
    total = sum(probs)
    return datasets.interleave_datasets(
        parts, probabilities=[p / total for p in probs], seed=seed, stopping_strategy="all_exhausted"
    )
