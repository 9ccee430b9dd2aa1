"""Which uploaded checkpoints a rerun may resume from: the ones this pipeline's owner uploaded, unchanged since.

On a tracking server anyone who can write to it could leave an unfinished run with the fingerprint a rerun
looks for, and DeepSpeed unpickles the `*_states.pt` it resumes from. So each rank, as it uploads a checkpoint
tag, uploads beside it the SHA-256 of each file it wrote, signed with a key only the owner's state folder
holds (`<state>/checkpoint-signing.key`, 0600, made on first use; HMAC-SHA256). A rerun resumes only from a run
whose every manifest of the newest tag verifies under that key, and loads nothing whose bytes do not match."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

KEY_FILE = "checkpoint-signing.key"
SUFFIX = ".digests.json"


def signing_key(state_dir: Path) -> bytes:
    """The owner's key, made (32 random bytes, readable by this user alone) the first time it is asked for."""
    path = state_dir / KEY_FILE
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # made meanwhile by another run on this store
            pass
        else:
            with os.fdopen(fd, "wb") as out:
                out.write(secrets.token_bytes(32))
    return path.read_bytes()


def manifest_name(tag: str, rank: int | None) -> str:
    """The artifact name of the manifest of one rank's files of a tag (rank 0's where one process writes all)."""
    return f"{tag}.rank{rank or 0}{SUFFIX}"


def is_manifest_of(name: str, tag: str) -> bool:
    return name.startswith(f"{tag}.rank") and name.endswith(SUFFIX)


def signature(key: bytes, run_id: str, folder: str, tag: str, files: dict[str, str]) -> str:
    signed = json.dumps({"run": run_id, "folder": folder, "tag": tag, "files": files}, sort_keys=True)
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()


def manifest(key: bytes, run_id: str, folder: str, tag: str, files: dict[str, str]) -> str:
    """The manifest text: each file (its path below the checkpoint folder) and its SHA-256, signed."""
    return json.dumps({"files": files, "signature": signature(key, run_id, folder, tag, files)}, sort_keys=True)


def verified_files(key: bytes, run_id: str, folder: str, tag: str, texts: list[str]) -> dict[str, str] | None:
    """The files and digests the manifests `texts` of a tag vouch for, all of them signed under `key` for this
    run, folder and tag; None when there is none or one does not verify."""
    files: dict[str, str] = {}
    for text in texts:
        try:
            entry = json.loads(text)
            listed, signed = dict(entry["files"]), str(entry["signature"])
        except (ValueError, KeyError, TypeError):
            return None
        if not hmac.compare_digest(signed, signature(key, run_id, folder, tag, listed)):
            return None
        files.update(listed)
    return files or None
