"""A full disk, told apart from other failures, as one line naming what could not be written.

The same fault reads differently by writer: an `OSError` with errno ENOSPC (Python file writes, the
artifact copies), SQLite's "database or disk is full" (the MLflow store, wrapped by SQLAlchemy and
MLflow), safetensors' "os error 28", and torch.save's stream errors, which carry no errno at all
(those count only while the disk really is nearly full).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from configs.errors import PipelineError

STORE_FULL = "database or disk is full"  # SQLite's SQLITE_FULL
NO_SPACE = ("no space left on device", "os error 28")
TORCH_WRITER = ("PytorchStreamWriter", "inline_container", "iostream error")
NEARLY_FULL_BYTES = 64 << 20


def no_space(error: BaseException, writing: Path, store: Path | None = None) -> PipelineError | None:
    """The one-line error for a full disk behind `error`, else None. `writing`: where the failing work
    writes when the error does not say (a stage's work dir, the state folder); `store`: the SQLite file.
    A user-facing error (this one, made closer to the write) is left as it is."""
    if isinstance(error, PipelineError):
        return None
    for exc in chain(error):
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            named = exc.filename2 or exc.filename  # a copy names its destination second
            return full(Path(str(named)) if isinstance(named, str | Path) else writing)
        text = str(exc)
        if STORE_FULL in text:
            return full(store or writing)
        if any(marker in text.lower() for marker in NO_SPACE):
            return full(writing)
        if any(marker in text for marker in TORCH_WRITER) and free_bytes(writing) < NEARLY_FULL_BYTES:
            return full(writing)
    return None


def check_room(folder: Path) -> None:
    """Stop before anything starts on a disk already (nearly) full: the first write to fail would leave
    Prefect's or MLflow's database half made."""
    free = free_bytes(folder)
    if free < NEARLY_FULL_BYTES:
        raise PipelineError(f"no space left on device writing {folder} ({free / 2**20:.1f} MiB free): "
                            "free space and rerun to resume")


def full(path: Path) -> PipelineError:
    return PipelineError(f"no space left on device writing {path}: free space and rerun to resume")


@contextmanager
def reported(writing: Path, store: Path | None = None):
    """Raise a full disk met in the block as its one-line error (the original as its cause)."""
    try:
        yield
    except Exception as exc:
        error = no_space(exc, writing, store)
        if error is None:
            raise
        raise error from exc


def chain(error: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def free_bytes(path: Path) -> float:
    """Free space for this user on the disk holding `path` (its nearest existing folder)."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                break
    return float("inf")
