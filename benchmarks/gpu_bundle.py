"""The wheels a bare CUDA machine needs to run benchmarks/gpu_stages.py, gpu_smoke.py and gpu_grpo.py: what the stage code
imports that such a machine (CUDA torch, transformers, accelerate, safetensors, tokenizers, pyarrow, pandas,
numpy, ...) lacks, at the versions installed here, for its Python (3.12, manylinux x86-64). DeepSpeed ships
no wheel: it is built here from its source (pure Python; its CUDA ops compile on first use, and the stages
use none of them). Checks the whole bundle fits the 64 MiB a GPU call may carry.

    python -m benchmarks.gpu_bundle [--dest .whl] [--python-version 3.12]

On the GPU machine (see docs/gpu.md):

    pip install --no-index --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.gpu_stages
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

LIMIT_MIB = 64
# what the stage code needs beyond such a machine's image; transformers and peft at this venv's versions, so
# the GPU runs the code the CPU tests ran
WHEELS = ("transformers", "peft", "datasets", "dill", "multiprocess", "pydantic", "pydantic_core",
          "annotated_types", "typing_inspection", "hjson", "trl")  # trl: gpu_grpo's other system (the bench extra)
BUILT_HERE = ("deepspeed",)  # source only on PyPI
FROM_GPU_EXTRA = ("liger-kernel",)  # not installed on a CPU machine: pinned by the `gpu` extra (model.use_liger_kernel)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def pins(names: tuple[str, ...]) -> list[str]:
    """`name==version` of each package as installed in this environment."""
    return [f"{name}=={md.version(name)}" for name in names]


def gpu_extra_pins(names: tuple[str, ...]) -> list[str]:
    """The `gpu` extra's requirement of each of `names`, as pyproject.toml pins it."""
    import tomllib

    extra = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    return [req for req in extra if req.split("==")[0] in names]


def fetch(dest: Path, python_version: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
                    "--implementation", "cp", *platforms, "-d", str(dest), *pins(WHEELS), *gpu_extra_pins(FROM_GPU_EXTRA)], check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), *pins(BUILT_HERE)],
                   check=True, env={**os.environ, "DS_BUILD_OPS": "0"})


def sizes(dest: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(dest.glob("*.whl"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", default=".whl", help="folder for the wheels (git-ignored where you carry it)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    fetch(dest, args.python_version)
    found = sizes(dest)
    for name, size in found.items():
        print(f"{size / 2**20:8.2f} MiB  {name}")
    total = sum(found.values()) / 2**20
    print(f"{total:8.2f} MiB  in all ({len(found)} wheels; a GPU call carries at most {LIMIT_MIB} MiB with the tree)")
    if total > LIMIT_MIB:
        print(f"error: the bundle in {dest} is {total:.1f} MiB, over {LIMIT_MIB} MiB; remove wheels the machine has")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
