"""The suite's shuffle seed: one of two fixed seeds, chosen by the parity of the checkout's commit count.

Each order is the same on every run of a commit (a failure reproduces), and consecutive commits alternate
between the two, so CI sees a second order without anyone asking for it. `pytest --randomly-seed=N` and
`pytest -p no:randomly` still decide when given (tests/conftest.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

SEEDS = (20261128, 20261207)  # an even commit count, and an odd one


def seed_for(commit_count: int | None) -> int:
    """The seed for a checkout with `commit_count` commits in HEAD's history; the first seed outside a git
    checkout (None)."""
    if commit_count is None:
        return SEEDS[0]
    return SEEDS[commit_count % 2]


def commit_count(repo: Path) -> int | None:
    """`git rev-list --count HEAD` in `repo`; None where it is no git checkout, or git is missing."""
    try:
        done = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = done.stdout.strip()
    return int(out) if done.returncode == 0 and out.isdigit() else None


def why(commit_count: int | None) -> str:
    """The header's line saying which seed the suite shuffles with, and why."""
    seed = seed_for(commit_count)
    if commit_count is None:
        return f"shuffle seed {seed}: not a git checkout, so the first of {SEEDS[0]} / {SEEDS[1]}"
    parity = "odd" if commit_count % 2 else "even"
    return (f"shuffle seed {seed}: HEAD has {commit_count} commits ({parity}); seeds alternate per commit, "
            f"{SEEDS[0]} on even counts, {SEEDS[1]} on odd (--randomly-seed=N overrides)")
