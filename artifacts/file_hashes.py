"""Content hashes of local files, kept in a small JSON file so that an unchanged model folder of
several GB is not read again on every run.

A kept hash is trusted only while the file's size, mtime, ctime and inode are those it was hashed at.
Restoring an edited file's mtime (`touch -d`, `os.utime`) cannot restore its ctime, so the edit is
seen; and a file whose ctime is within `RACY_S` of the hashing is not kept at all, since an edit in
the same clock tick could leave every stamp as it was (git's "racily clean" entries)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

RACY_S = 2.0  # coarser than any file system's timestamp granularity here (FAT's 2 s included)


def stamp(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class FileHashes:
    """`digest(path)` -> `"<size>:<sha256>"`, served from `cache_file` (None: hash every time) when the
    file is as it was hashed. `save()` writes the new hashes; a lost race only costs a later re-hash."""

    def __init__(self, cache_file: Path | None = None):
        self.cache_file = cache_file
        self.known: dict[str, list] = {}
        self.changed = False
        if cache_file is not None:
            try:
                self.known = json.loads(cache_file.read_text())
            except (OSError, ValueError):
                self.known = {}  # none yet, or unreadable: hash again

    def digest(self, path: Path) -> str:
        path = path.resolve()
        stat = path.stat()
        entry = self.known.get(str(path))
        if entry is not None and entry[:4] == stamp(stat):
            return f"{stat.st_size}:{entry[4]}"
        started = time.time_ns()
        content = sha256(path)
        after = path.stat()
        if stamp(after) == stamp(stat) and after.st_ctime_ns < started - RACY_S * 1e9:
            self.known[str(path)] = [*stamp(stat), content]
            self.changed = True
        return f"{stat.st_size}:{content}"

    def save(self) -> None:
        if self.cache_file is None or not self.changed:
            return
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache_file.parent, prefix=f".{self.cache_file.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(self.known, f)
        os.replace(tmp, self.cache_file)  # whole or not at all, for a concurrent run reading it
        self.changed = False
