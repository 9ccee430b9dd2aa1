"""The process side of a training rank, with or without Ray: threads, the torch.distributed
environment (rendezvous address, rank variables) and leaving the group when the work is done."""

from __future__ import annotations

import os
import socket
import sys


def prepare_process(num_threads: int) -> None:
    """In a fresh Ray worker process: name the accelerator, use the cores this actor holds, quiet HF bars."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # say it, rather than have DeepSpeed warn it guessed
    use_threads(num_threads)
    quiet_progress_bars()


def quiet_progress_bars() -> None:
    """HF's progress bars off in this process, without importing transformers for it (a reward worker of a
    rule function never does): transformers reads huggingface_hub's setting when it is first imported."""
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    else:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"


def use_threads(num_threads: int) -> None:
    """torch's intra-op thread count, set only where OMP_NUM_THREADS (which Ray sets to an actor's
    `num_cpus`, `thread_env` to its cores) has not already made it so. `torch.set_num_threads` also turns
    MKL's dynamic threading off for the life of the process, and MKL then opens a nested OpenMP region
    for every matmul inside torch's own parallel loops (SDPA's CPU kernels), each a futex call: slower
    training steps (`benchmarks/threads.py` measures it)."""
    import torch

    if torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)


def free_port() -> int:
    """A TCP port nothing on this machine listens on now."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_address() -> str:
    """This node's IP as other nodes reach it: Ray's when this process is a Ray worker, else loopback
    (every rank in this process or on this machine)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return "127.0.0.1"


def free_address() -> tuple[str, int]:
    """This node's IP and a free port: rank 0's rendezvous point for torch.distributed."""
    return node_address(), free_port()


def rank_env(master: tuple[str, int], rank: int, world_size: int) -> dict[str, str]:
    """The environment torch.distributed (and DeepSpeed) read to join the group."""
    return dict(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]), RANK=str(rank), WORLD_SIZE=str(world_size),
                LOCAL_RANK="0")


def join_env(master: tuple[str, int], rank: int, world_size: int) -> None:
    os.environ.update(rank_env(master, rank, world_size))


def single_rank_env() -> dict[str, str]:
    """A group of one rank in this process (stage tests, benchmarks): rank 0 of 1 on a free local port."""
    return rank_env(("127.0.0.1", free_port()), 0, 1)


def leave_process_group() -> None:
    """A worker exiting with a process group open crashes Ray's task receiver. Through DeepSpeed when it
    made the group: it also drops the subgroups it cached, which the next stage in this process would
    otherwise find stale."""
    import torch

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    ds_comm = sys.modules.get("deepspeed.comm.comm")
    if ds_comm is not None and ds_comm.cdb is not None:
        ds_comm.destroy_process_group()
    else:
        torch.distributed.destroy_process_group()
