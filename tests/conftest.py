"""For the whole suite: the bytecode of every module imported is cached on disk.

The README's test command installs without compiling (`pip install --no-compile`, `uv pip install`:
compiling every installed file, one after another, took longer than the imports the suite makes), so Python compiles
what it imports and keeps it. The suite starts hundreds of Python processes (the CLI, Prefect and MLflow
servers, Ray workers); where PYTHONDONTWRITEBYTECODE is set, as in many containers, each would compile
torch, transformers and Ray again. This process and every one it starts write their bytecode."""

import os
import sys

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

