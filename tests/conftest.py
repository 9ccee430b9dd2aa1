"""For the whole suite: the bytecode of every module imported is cached on disk.

The README's test command installs without compiling (`pip install --no-compile`: compiling every
installed file, one after another, took longer than the imports the suite makes), so Python compiles
what it imports and keeps it. The suite starts hundreds of Python processes (the CLI, Prefect and MLflow
servers, Ray workers); where PYTHONDONTWRITEBYTECODE is set, as in many containers, each would compile
torch, transformers and Ray again. This process and every one it starts write their bytecode."""

import os
import sys

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


# The longest files, started first when the README's command runs two at once (`-n 2 --dist loadfile`): one
# begun last would run on alone after every other file is done. At the start xdist gives each worker a second
# file to queue, which waits until the first ends: behind the longest goes a unit-test file (seconds). Applied
# after pytest-randomly's shuffle: the order within each file, and of every other file, stays random.
LONGEST_FIRST = (
    "tests/flow/test_pipeline_e2e.py",
    "tests/flow/test_cluster.py",
    "tests/flow/test_multi_rank.py",
    "tests/flow/test_openrlhf_scripts_run.py",
)


def pytest_collection_modifyitems(items):
    def path(item) -> str:
        return item.nodeid.split("::")[0]

    files = list(dict.fromkeys(path(item) for item in items))
    longest = [f for f in LONGEST_FIRST if f in files]
    quick = [f for f in files if f.startswith("tests/unit/")][:1]
    order = {f: i for i, f in enumerate([*longest[:2], *quick, *longest[2:]])}
    items.sort(key=lambda item: order.get(path(item), len(order)))  # stable: the shuffled order stays within a rank
