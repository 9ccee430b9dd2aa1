"""The presets for real models: each loads and validates, asks for the GPUs its layout needs, and
its math reward checks GSM8K-style answers."""

import importlib.util
from pathlib import Path

import pytest

from configs import load_config
from configs.loader import PRESET_DIR
from stages.dag.preflight import check_inputs
from stages.rl.layout import bundles_needed, group_sizes, pools

PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
GPU_PRESETS = {"qwen2.5-0.5b-gsm8k": 1, "llama3-8b-node": 8, "llama3-8b-cluster": 32}
TEMPLATES = {"files-example"}  # a config to copy: its data paths are the user's


def test_every_preset_is_listed():
    assert set(GPU_PRESETS) | {"tiny"} | TEMPLATES == set(PRESETS)


@pytest.mark.parametrize("name", sorted(set(PRESETS) - TEMPLATES))
def test_preset_loads_and_passes_preflight(name):
    cfg = load_config(name)
    check_inputs(cfg)  # a hub id is accepted as one; hub datasets are read when the stage runs
    if name != "tiny":
        assert cfg.model.name_or_path and cfg.infra.precision == "bf16" and cfg.infra.gpus_per_worker == 1


@pytest.mark.parametrize(("name", "gpus"), GPU_PRESETS.items())
def test_rl_layout_needs_the_gpus_the_preset_says(name, gpus):
    cfg = load_config(name)
    assert bundles_needed(cfg, cfg.rl.algorithm.needs_critic)[1] == gpus
    assert cfg.infra.num_workers * cfg.infra.gpus_per_worker <= gpus  # the training stages fit too


def test_the_cluster_preset_mirrors_openrlhfs_layout():
    cfg = load_config("llama3-8b-cluster")
    sizes = group_sizes(cfg, needs_critic=True)
    assert sizes == {"actor": 16, "engine": 8, "reward": 1, "ref": 1, "critic": 8}
    assert sorted(map(sorted, pools(cfg, list(sizes)))) == [["actor", "ref"], ["critic", "reward"], ["engine"]]


def test_a_local_model_path_stands_in_for_the_hub_id(tmp_path):
    from tests.tiny_checkpoint import save_tiny_checkpoint

    local = save_tiny_checkpoint(["What is 1+2?\n1+2=3\n#### 3"], tmp_path / "Qwen2.5-0.5B-Instruct")
    check_inputs(load_config("qwen2.5-0.5b-gsm8k", [f"model.name_or_path={local}"]))


def gsm8k_reward():
    path = Path(PRESET_DIR) / "rewards" / "gsm8k.py"
    spec = importlib.util.spec_from_file_location("gsm8k_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


def test_gsm8k_reward_reads_the_final_answer():
    responses = ["3 + 4 = 7\n#### 7", "so the answer is \\boxed{1,200}", "It costs 12.0 dollars", "7 apples, then 8", "no idea"]
    labels = ["7", "1200", "12", "7", "7"]
    out = gsm8k_reward()([f"Q: {r}" for r in responses], ["Q: "] * 5, labels)
    assert out["rewards"].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]  # the last number counts, not the first
    assert out["extra_logs"]["answered"].tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]


def test_the_files_template_runs_its_checks_once_its_files_exist(tmp_path, monkeypatch):
    """What a user who copies configs/files-example.yaml has: the files it names, OpenRLHF-shaped."""
    import json

    from stages.dag.preflight import check
    from tests.tiny_checkpoint import save_tiny_checkpoint

    model = save_tiny_checkpoint(["Name a colour.\nblue"] * 4, tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    lines = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)  # noqa: E731
    (data / "sft.jsonl").write_text(lines({"question": f"Name colour {i}.", "response": "blue"} for i in range(30)))
    (data / "preferences.jsonl").write_text(lines(
        {"prompt": f"Name colour {i}.", "chosen": [{"role": "assistant", "content": "blue"}],
         "rejected": [{"role": "assistant", "content": "7"}]} for i in range(30)))
    (data / "prompts.jsonl").write_text(lines(
        {"context_messages": [{"role": "user", "content": f"Name colour {i}."}], "answer": "blue"} for i in range(30)))
    (tmp_path / "my_reward.py").write_text(
        "def reward_func(queries, prompts, labels):\n    return [float(l in q) for q, l in zip(queries, labels)]\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("files-example", [f"model.name_or_path={model}", "infra.num_cpus=2"])
    check(cfg)
    assert cfg.rl.actor.lr == 5e-7 and cfg.reward.func_path == "my_reward.py"
