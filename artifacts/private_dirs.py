"""Folders of this user's own under the machine's shared temp folder (`/tmp` is writable by every user): made
0700, and refused when another user made the name first, left it open to others, or put a link there, since
stage files and Ray's sockets inside would then be theirs to read or replace."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from configs.errors import PipelineError


def private_dir(name: str) -> Path:
    """`<system temp>/<name>-<uid>`, this user's alone (made if missing)."""
    path = Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    found = os.lstat(path)
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise PipelineError(f"{path}: not a folder of this user's own (a link or a file); remove it and run again")
    if found.st_uid != os.getuid():
        raise PipelineError(f"{path}: owned by user id {found.st_uid}, not this user ({os.getuid()}); another user may "
                            "have made it to read or replace this user's files: remove it and run again")
    if found.st_mode & 0o077:
        raise PipelineError(f"{path}: open to other users (mode {stat.S_IMODE(found.st_mode):o}); chmod 700 it or "
                            "remove it, and run again")
    return path
