"""The flow's driver (the `rlhf run` process) checks the config and orchestrates; the stages' libraries
load where a stage runs. Importing them in the driver would cost seconds that a fully cached run pays
for nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.markers import cpu_only

HEAVY = ("torch", "transformers", "peft", "deepspeed", "datasets", "vllm", "matplotlib")  # matplotlib: where eval draws

pytestmark = pytest.mark.slow  # `pytest -m "not slow"`: the fast lane (docs/testing.md)

DRIVER = f"""
import sys
from configs import load_config
from flows import pipeline
from flows.cli import main as cli
from stages.dag import preflight

preflight.check(load_config(None, []))
print(" ".join(sorted(set({HEAVY!r}) & set(sys.modules))))
"""


def test_the_driver_checks_the_preset_and_loads_the_flow_without_the_stages_libraries():
    done = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == ""


@cpu_only
def test_an_option_that_needs_a_gpu_is_still_checked_in_the_driver():
    code = DRIVER.replace("load_config(None, [])", "load_config(None, ['model.attn_implementation=flash_attention_2'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "flash_attention_2 needs a CUDA GPU" in done.stderr


def test_a_files_config_is_checked_with_datasets_but_without_torch(tmp_path):
    """Reading a data file's first rows takes HF `datasets` (its streaming reader would import torch: not used)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"")
    rows = "".join(f'{{"prompt": "q{i}", "response": "a{i}", "label": "{i}"}}\n' for i in range(3000))
    for name in ("sft", "prompts"):
        (tmp_path / f"{name}.jsonl").write_text(rows)
    overrides = [f"model.name_or_path={model}", "data.source=files", f"data.sft.paths=[{tmp_path / 'sft.jsonl'}]",
                 "data.sft.input_key=prompt", "data.sft.output_key=response",
                 f"data.prompts.paths=[{tmp_path / 'prompts.jsonl'}]", "data.prompts.input_key=prompt"]
    code = DRIVER.replace("load_config(None, [])", f"load_config(None, {overrides!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "datasets"
