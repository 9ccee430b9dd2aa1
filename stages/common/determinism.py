"""`infra.deterministic`: the same config on the same machine gives the same bytes, in every process of a run.

Two things decide whether a float computation repeats exactly. Which algorithm a library picks: torch's
deterministic mode, cuDNN's and oneDNN's deterministic flags, cuBLAS's fixed workspace, flash-attn's
deterministic backward. And how a BLAS splits a matrix product: MKL (torch's CPU BLAS) picks kernels by the
memory alignment of its operands, which differs between processes, so two runs of one step could differ in the
last bits (6e-6 after one RL step). Its conditional numerical reproducibility mode (`MKL_CBWR=AUTO,STRICT`) fixes
the split whatever the alignment and thread count; MKL reads it once, at a process's first call, so it goes in the
environment of every process before any of them computes (`export_env`, the Ray job's `runtime_env`).
Thread counts are fixed already: each worker's is its bundle's CPUs (`dist_env.prepare_process`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from pathlib import Path

# what each process's environment holds before its first computation in the deterministic mode
ENV = {
    "MKL_CBWR": "AUTO,STRICT",  # MKL's reproducible kernel choice, independent of alignment and threads
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # cuBLAS's deterministic reductions (torch's deterministic mode asks for it)
    "FLASH_ATTENTION_DETERMINISTIC": "1",  # transformers' flash-attn integration: the deterministic backward
}

# MKL's constants (mkl_cbwr.h): the branch field of its mode, and the mode asked for
MKL_CBWR_BRANCH, MKL_CBWR_BRANCH_OFF = 1, 1
MKL_CBWR_AUTO_STRICT = 2 | 0x10000


class NotReproducible(RuntimeError):
    """MKL in this process has computed already without its reproducible mode, which it cannot change after."""


def env(deterministic: bool) -> dict[str, str]:
    """The environment variables a process of a run in this mode starts with."""
    return dict(ENV) if deterministic else {}


def export_env(deterministic: bool) -> None:
    """This process's environment, which the processes it starts inherit (a local Ray cluster's workers); a value the
    user set stays (e.g. MKL_CBWR=AVX2 for the same bytes across CPU generations)."""
    for key, value in env(deterministic).items():
        os.environ.setdefault(key, value)


def seed_all(seed: int, deterministic: bool) -> None:
    """What a stage does before it computes: Python's, numpy's and torch's generators seeded (transformers'
    `set_seed`), and the deterministic choices of `apply`."""
    from transformers import set_seed

    set_seed(seed)
    apply(deterministic)


def apply(deterministic: bool) -> None:
    """In a process about to compute for a stage: torch's, cuDNN's and oneDNN's deterministic choices on or off,
    and MKL's reproducible mode checked (set, where it has not computed yet)."""
    import torch

    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False  # autotuning picks kernels by timing
    torch.backends.mkldnn.deterministic = deterministic  # type: ignore[assignment]  # a flag the stubs type as its descriptor
    if deterministic:
        require_mkl_reproducible()


def require_mkl_reproducible() -> None:
    mkl = mkl_library()
    if mkl is None:  # a torch without MKL (an ARM build): nothing of MKL's to fix
        return
    if mkl.mkl_serv_cbwr_get(MKL_CBWR_BRANCH) != MKL_CBWR_BRANCH_OFF:
        return  # a reproducible mode already: ours from the environment, or the user's own MKL_CBWR
    if mkl.mkl_serv_cbwr_set(MKL_CBWR_AUTO_STRICT) != 0:
        raise NotReproducible("infra.deterministic: MKL has already computed in this process (pid "
                              f"{os.getpid()}) without MKL_CBWR; start it with MKL_CBWR=AUTO,STRICT in its environment")


@functools.cache
def mkl_library() -> ctypes.CDLL | None:
    """torch's CPU library, where MKL is linked in with its mode functions exported; None where it is not."""
    import torch

    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    with contextlib.suppress(OSError):
        lib = ctypes.CDLL(str(path))
        if hasattr(lib, "mkl_serv_cbwr_get") and hasattr(lib, "mkl_serv_cbwr_set"):
            return lib
    return None
