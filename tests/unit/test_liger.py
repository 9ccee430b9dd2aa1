"""model.use_liger_kernel (stages/common/liger.py): refused in one line on a machine without CUDA, before any
weights load; without liger-kernel installed; and for a model family Liger has no kernels for. On a GPU the
loader hands the loaded model to liger-kernel: that hand-over is checked here against a stand-in package (this
machine has neither CUDA nor liger-kernel, whose Triton kernels have no CPU path)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from configs.errors import CheckpointError
from configs.schema import ModelConfig
from stages.common import checkpoint, liger
from tests.markers import cpu_only
from tests.tiny_checkpoint import save_tiny_checkpoint

pytestmark = pytest.mark.timeout(60)

LIGER = ModelConfig(use_liger_kernel=True, attn_implementation="sdpa")
NO_GPU = ("model.use_liger_kernel needs a CUDA GPU (Liger's kernels are Triton) and this machine has none; "
          "set model.use_liger_kernel=false")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_tiny_checkpoint(["Compute 1+2\n1+2=3\nAnswer: 3"] * 4, tmp_path_factory.mktemp("llama") / "model")


@cpu_only
def test_without_cuda_it_is_one_line_before_any_weights_load(tmp_path):
    with pytest.raises(CheckpointError) as refused:
        liger.require()
    assert str(refused.value) == NO_GPU
    # an empty folder: the error is Liger's, not the loader's, so it came first
    with pytest.raises(CheckpointError, match=r"^model.use_liger_kernel needs a CUDA GPU"):
        checkpoint.load_causal_lm(tmp_path, LIGER)


def test_a_model_that_is_only_copied_loads_without_the_kernels(llama):
    model = checkpoint.load_causal_lm(llama, LIGER, kernels=False)  # data_prep's copy of the base model
    assert model.config.model_type == "llama"


@pytest.fixture
def on_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_without_liger_kernel_installed_it_is_one_line(on_a_gpu, monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # `import liger_kernel` raises ImportError
    with pytest.raises(CheckpointError) as refused:
        liger.require()
    assert str(refused.value) == "model.use_liger_kernel needs liger-kernel: pip install 'rlhf-pipeline[gpu]'"


@pytest.fixture
def stand_in(on_a_gpu, monkeypatch) -> list[tuple[torch.nn.Module, dict]]:
    """liger_kernel.transformers.monkey_patch with kernels for llama only; the calls it gets."""
    calls: list[tuple[torch.nn.Module, dict]] = []
    patch = types.ModuleType("liger_kernel.transformers.monkey_patch")
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": object(), "qwen2": object()}  # type: ignore[attr-defined]
    patch._apply_liger_kernel_to_instance = lambda model, **kwargs: calls.append((model, kwargs))  # type: ignore[attr-defined]
    for name, module in (("liger_kernel", types.ModuleType("liger_kernel")),
                         ("liger_kernel.transformers", types.ModuleType("liger_kernel.transformers")),
                         ("liger_kernel.transformers.monkey_patch", patch)):
        monkeypatch.setitem(sys.modules, name, module)
    return calls


def test_on_a_gpu_the_loader_hands_the_loaded_model_to_liger(stand_in, llama):
    model = checkpoint.load_causal_lm(llama, LIGER)
    # the fused linear cross-entropy left off: every stage's loss is computed from the logits
    assert stand_in == [(model, {"fused_linear_cross_entropy": False})]
    checkpoint.load_causal_lm(llama, ModelConfig(attn_implementation="sdpa"))  # the key off: not handed over
    assert len(stand_in) == 1


def test_a_family_liger_has_no_kernels_for_is_one_line(stand_in):
    gpt2 = types.SimpleNamespace(config=types.SimpleNamespace(model_type="gpt2"))
    with pytest.raises(CheckpointError) as refused:
        liger.apply(gpt2)  # type: ignore[arg-type]
    assert str(refused.value) == ("model.use_liger_kernel: Liger has no kernels for model_type 'gpt2' (it has them for "
                                  "llama, qwen2); set model.use_liger_kernel=false")
    assert stand_in == []
