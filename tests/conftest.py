"""For the whole suite: the bytecode of every module imported is cached on disk, the deterministic mode, the shuffle seed.

The README's test command installs without compiling (`pip install --no-compile`, `uv pip install`:
compiling every installed file, one after another, took longer than the imports the suite makes), so Python compiles
what it imports and keeps it. The suite starts hundreds of Python processes (the CLI, Prefect and MLflow
servers, Ray workers); where PYTHONDONTWRITEBYTECODE is set, as in many containers, each would compile
torch, transformers and Ray again. This process and every one it starts write their bytecode.

The tests run in the order of one of two fixed seeds, by the parity of the checkout's commit count
(tests/shuffle_seed.py), unless the command line names one or turns pytest-randomly off."""

import os
import shlex
import sys
from pathlib import Path

import pytest

from stages.common import determinism
from tests import shuffle_seed

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The tests run the tiny preset, whose infra.deterministic is on: MKL's reproducible mode must be in this process's
# environment before its first matrix product (stage functions the tests call here), and in every process it starts.
determinism.export_env(True)

# --- the shuffle seed: one of two fixed seeds by the commit count's parity (tests/shuffle_seed.py) ---------------

SEED_CHOICE = pytest.StashKey[str]()  # the header's line, where this file chose the seed


def seed_given(config: pytest.Config) -> bool:
    """Whether the command line or PYTEST_ADDOPTS names a seed (`--randomly-seed=default` too, which asks for a
    random one)."""
    args = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))]
    return any(str(arg).startswith("--randomly-seed") for arg in args)


@pytest.hookimpl(tryfirst=True)  # before pytest-randomly's own, which turns "no seed given" into a random one
def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("randomly") or config.getoption("randomly_seed", None) != "default":
        return  # `-p no:randomly`, or a seed the user gave
    if seed_given(config) or hasattr(config, "workerinput"):
        return  # an explicit `--randomly-seed=default`; a pytest-xdist worker takes its controller's seed
    count = shuffle_seed.commit_count(Path(config.rootpath))
    config.option.randomly_seed = shuffle_seed.seed_for(count)
    config.stash[SEED_CHOICE] = shuffle_seed.why(count)


def pytest_report_header(config: pytest.Config) -> str | None:
    return config.stash.get(SEED_CHOICE, None)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """The seed again at the end, where `pytest -q` (no header) shows it too: what reruns this order."""
    if config.pluginmanager.hasplugin("randomly") and config.stash.get(SEED_CHOICE, None):
        terminalreporter.write_line(f"{config.stash[SEED_CHOICE]}; this order again: --randomly-seed={config.option.randomly_seed}")
