"""For the whole suite: the bytecode of every module imported is cached on disk.

The README's test command installs without compiling (`pip install --no-compile`, `uv pip install`:
compiling every installed file, one after another, took longer than the imports the suite makes), so Python compiles
what it imports and keeps it. The suite starts hundreds of Python processes (the CLI, Prefect and MLflow
servers, Ray workers); where PYTHONDONTWRITEBYTECODE is set, as in many containers, each would compile
torch, transformers and Ray again. This process and every one it starts write their bytecode."""

import os
import sys

from stages.common import determinism

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The tests run the tiny preset, whose infra.deterministic is on: MKL's reproducible mode must be in this process's
# environment before its first matrix product (stage functions the tests call here), and in every process it starts.
determinism.export_env(True)

