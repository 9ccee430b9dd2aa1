"""Where a benchmark's numbers were taken: the machine and the versions of the libraries that set them."""

from __future__ import annotations

import importlib.metadata
import os
import platform

VERSIONED = ("torch", "transformers", "deepspeed", "trl")


def machine() -> dict:
    """Where the numbers were taken."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions: dict[str, str | None] = {}
    for package in VERSIONED:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "memory_gib": round(memory, 1),
            "python": platform.python_version(), **versions}
