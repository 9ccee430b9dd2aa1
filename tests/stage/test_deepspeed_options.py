"""DeepSpeed engine options on one CPU rank: every ZeRO stage (the tiny preset runs 0) and ZeRO-Offload
and ZeRO-3 parameter offload train exactly as the plain engine does, and a ZeRO-3 model is gathered
whole for the HF checkpoint."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from configs.schema import InfraConfig, TrainingConfig
from stages.common import deepspeed_engine
from stages.common.dist_env import free_port
from stages.rl.ema import PolicyAverage
from tests.tiny_llama import tiny_llama


def train_three_steps(infra: InfraConfig, **zero_extra):
    deepspeed_engine.init_distributed()
    train = TrainingConfig(lr=1e-2, micro_batch_size=2, warmup_ratio=0.0, min_lr_ratio=1.0)  # constant lr
    config = deepspeed_engine.engine_config(infra, train, 3)
    config["zero_optimization"].update(zero_extra)
    engine = deepspeed_engine.initialize(tiny_llama(), config)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return engine, losses


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_every_zero_stage_trains_as_stage_0(zero_stage):
    _, plain = train_three_steps(InfraConfig(zero_stage=0))
    _, partitioned = train_three_steps(InfraConfig(zero_stage=zero_stage))
    assert plain[0] > plain[-1]
    assert partitioned == pytest.approx(plain, abs=1e-5)


@pytest.mark.parametrize(("zero_stage", "offload_optimizer", "offload_params"),
                         [(2, True, False), (3, True, False), (3, True, True)])
@pytest.mark.slow
def test_offloaded_engines_train_as_the_plain_one(zero_stage, offload_optimizer, offload_params):
    _, plain = train_three_steps(InfraConfig(zero_stage=zero_stage))
    engine, offloaded = train_three_steps(InfraConfig(zero_stage=zero_stage, offload_optimizer=offload_optimizer,
                                                      offload_params=offload_params, overlap_comm=True))
    zero = engine._config.zero_config  # what DeepSpeed made of the config
    assert zero.offload_optimizer is not None and (zero.offload_param is not None) == offload_params
    assert plain[0] > plain[-1]  # it learned something
    assert offloaded == pytest.approx(plain, abs=1e-5)


def test_zero3_weights_are_gathered_whole_for_the_checkpoint():
    # threshold 0: even these small weights are partitioned (by default they would stay whole)
    engine, _ = train_three_steps(InfraConfig(zero_stage=3), stage3_param_persistence_threshold=0)
    assert all(p.numel() == 0 for p in engine.module.parameters())  # the module holds no weights outside a gather
    state = deepspeed_engine.full_state_dict(engine)
    reference = tiny_llama().state_dict()
    assert set(state) >= {n for n, _ in tiny_llama().named_parameters()}
    for name, tensor in state.items():
        assert tensor.shape == reference[name].shape, name
    assert not torch.equal(state["model.embed_tokens.weight"], reference["model.embed_tokens.weight"])  # trained
    model = tiny_llama()
    model.load_state_dict(state, strict=False)  # what checkpoint.save writes loads back
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])


def test_zero3_policy_average_gathers_each_partitioned_weight():
    """rl.actor.ema_beta under ZeRO-3 (stages/rl/ema.py): each partitioned weight is gathered into the average, which
    after three steps at beta 0.5 is W0/8 + W1/8 + W2/4 + W3/2 of the starting and per-step weights."""
    deepspeed_engine.init_distributed()
    train = TrainingConfig(lr=1e-2, micro_batch_size=2, warmup_ratio=0.0, min_lr_ratio=1.0)
    config = deepspeed_engine.engine_config(InfraConfig(zero_stage=3), train, 3)
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    engine = deepspeed_engine.initialize(tiny_llama(), config)
    ema = PolicyAverage(engine.module, 0.5, zero3=True, keeps=True)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    weights = [deepspeed_engine.full_state_dict(engine)]
    for _ in range(3):
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        ema.update(engine.module)
        weights.append(deepspeed_engine.full_state_dict(engine))
    assert all(p.numel() == 0 for p in engine.module.parameters())  # partitioned: nothing whole outside a gather
    w0, w1, w2, w3 = weights
    averaged = ema.applied(w3, engine.module)
    for name in ema.average:
        expected = w0[name] / 8 + w1[name] / 8 + w2[name] / 4 + w3[name] / 2
        assert torch.allclose(averaged[name], expected, atol=1e-6), name
    assert not torch.equal(averaged["model.embed_tokens.weight"], w3["model.embed_tokens.weight"])


KERNEL_CHECK = """
import torch
import deepspeed.comm.comm as ds_comm
from deepspeed.runtime import compiler
from configs.schema import InfraConfig, TrainingConfig
from stages.common import deepspeed_engine

deepspeed_engine.init_distributed()
assert ds_comm.cdb.shm_comm_op is None  # its shared-memory all-reduce kernel was not compiled nor loaded
train = TrainingConfig(lr=1e-2, micro_batch_size=2)
engine = deepspeed_engine.initialize(torch.nn.Linear(4, 4), deepspeed_engine.engine_config(InfraConfig(), train, 3))
from deepspeed.runtime.zero.muon import original_muon
compiled = [name for name in ("zeropower_via_newtonschulz5", "muon_update")
            if hasattr(getattr(original_muon, name), "_torchdynamo_orig_callable")]
assert not compiled, compiled
assert compiler.compile() is torch.compile  # DeepSpeed's own decorator is back for everything else
"""


@pytest.mark.slow
def test_engines_start_without_compiling_deepspeeds_kernels():
    """Every ZeRO engine imports DeepSpeed's Muon optimizer; compiling its kernels lengthened each training
    process's start. DeepSpeed's shared-memory all-reduce op (inference only) was built at the first
    process group of each virtualenv, a long compile. A fresh process, so no earlier import in this one
    decides the outcome."""
    root = Path(__file__).resolve().parents[2]
    # a port of its own: this process's rendezvous port is taken by its in-process engines
    env = os.environ | {"MASTER_PORT": str(free_port()), "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "built successfully" not in done.stdout


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_the_step_reports_the_gradients_norm_before_clipping(zero_stage):
    """y = w . x has gradient x. Two micro-steps of x = (3, 4) and (9, 12) average to (6, 8): norm 10, whatever
    `grad_clip` (1) then does to them; no norm between the two. ZeRO's optimizers compute it, stage 0's is measured."""
    deepspeed_engine.init_distributed()
    train = TrainingConfig(lr=1e-2, micro_batch_size=1, grad_accum_steps=2, grad_clip=1.0, warmup_ratio=0.0, min_lr_ratio=1.0)
    engine = deepspeed_engine.initialize(torch.nn.Linear(2, 1, bias=False),
                                         deepspeed_engine.engine_config(InfraConfig(zero_stage=zero_stage), train, 2))
    norms = []
    for x in ([3.0, 4.0], [9.0, 12.0]):
        engine.backward(engine(torch.tensor([x])).sum())
        norms.append(deepspeed_engine.step(engine))
    assert norms[0] is None and norms[1] == pytest.approx(10.0, rel=1e-5)


@pytest.mark.parametrize(("scheduler", "expected"), [
    # DeepSpeed steps its scheduler after each optimizer step: the k-th lr read is the schedule at iteration k-1.
    # Warm-up of 2 steps (warmup_ratio 0.5 of 4) rises linearly 0, 0.5, then 1; linear decays over the 2 left
    ("constant_with_warmup", [0.0, 0.5, 1.0, 1.0]),
    ("linear", [0.0, 0.5, 1.0, 0.5]),
    ("constant", [1.0, 1.0, 1.0, 1.0]),  # no warm-up either, as HF's constant
])
def test_each_lr_scheduler_follows_its_schedule_and_adam_takes_the_betas(scheduler, expected):
    deepspeed_engine.init_distributed()
    train = TrainingConfig(lr=1.0, micro_batch_size=1, warmup_ratio=0.5, lr_scheduler=scheduler, adam_betas=(0.8, 0.99))
    engine = deepspeed_engine.initialize(torch.nn.Linear(2, 1), deepspeed_engine.engine_config(InfraConfig(zero_stage=0), train, 4))
    lrs = []
    for _ in range(4):
        engine.backward(engine(torch.ones(1, 2)).sum())
        engine.step()
        lrs.append(engine.get_lr()[0])
    assert lrs == pytest.approx(expected)
    assert engine.optimizer.param_groups[0]["betas"] == (0.8, 0.99)
