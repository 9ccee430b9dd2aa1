"""The policy's loss over one optimizer step of uneven micro-batches, under DeepSpeed's gradient
accumulation: the same gradient as one micro-batch holding the whole step (OpenRLHF's global token mean)."""

import pytest
import torch

from configs.schema import InfraConfig, RLConfig, TrainingConfig
from stages.common import deepspeed_engine
from stages.rl.workers import actor_loss, token_log_probs, train_steps
from tests.tiny_llama import tiny_llama

RL = RLConfig(algorithm={"use_kl_loss": True, "kl_estimator": "k3", "entropy_coef": 0.01})


def micro_batch(responses: list[int], seed: int, width: int = 12, prompt: int = 3) -> dict[str, torch.Tensor]:
    """Rows of a 3-token prompt and a response of the given length, right-padded to `width`."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(responses)
    attention_mask = torch.zeros(rows, width, dtype=torch.long)
    action_mask = torch.zeros(rows, width - 1)
    for i, n in enumerate(responses):
        attention_mask[i, : prompt + n] = 1
        action_mask[i, prompt - 1 : prompt - 1 + n] = 1
    return {
        "input_ids": torch.randint(0, 100, (rows, width), generator=gen) * attention_mask,
        "attention_mask": attention_mask,
        "action_mask": action_mask,
        "advantages": torch.randn(rows, width - 1, generator=gen) * action_mask,
        "ref_log_probs": -5 + torch.randn(rows, width - 1, generator=gen),
        "kl_coef": torch.full((rows,), 0.1),
    }


def one_step(micros: list[dict], per_micro_batch_mean: bool = False):
    """One optimizer step over `micros` (gradient accumulation over all of them): the global gradient
    norm, each weight's update and the logged losses. Adam's first update is lr * g / (|g| + eps): with
    eps 1 it is monotone in each gradient element, so equal updates mean equal gradients."""
    deepspeed_engine.init_distributed()
    train = TrainingConfig(lr=1.0, micro_batch_size=2, grad_accum_steps=len(micros), warmup_ratio=0.0, min_lr_ratio=1.0)
    config = deepspeed_engine.engine_config(InfraConfig(zero_stage=1), train, 1)
    config["optimizer"]["params"]["eps"] = 1.0
    engine = deepspeed_engine.initialize(tiny_llama(), config)
    before = [p.detach().clone() for p in engine.module.parameters()]
    with torch.no_grad():  # the old policy is this one: ratios of 1, every token in the clip range
        micros = [m | {"old_log_probs": token_log_probs(engine, m, RL.rollout.temperature)} for m in micros]

    def loss(micro, units):
        return actor_loss(engine, micro, RL, None if per_micro_batch_mean else units)

    logs = train_steps(engine, micros, len(micros), 1, loss)
    updates = [b - p.detach() for b, p in zip(before, engine.module.parameters())]
    return float(engine.get_global_grad_norm()), updates, logs


def test_uneven_micro_batches_step_as_one_batch_of_the_whole_step():
    first, second = micro_batch([9, 8], seed=1), micro_batch([1, 2], seed=2)  # 17 response tokens, then 3
    whole = {k: torch.cat([first[k], second[k]]) for k in first}
    norm_two, updates_two, logs_two = one_step([first, second])
    norm_one, updates_one, logs_one = one_step([whole])
    assert norm_two == pytest.approx(norm_one, rel=1e-5)
    for a, b in zip(updates_two, updates_one):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-8)
    for key in ("policy_loss", "entropy", "kl_loss"):  # each micro-batch logs its share: their mean is the step's
        assert sum(logs_two[key]) / 2 == pytest.approx(logs_one[key][0], rel=1e-5)
    # each micro-batch's own mean, averaged: the 3 tokens of the second weigh as much as the 17 of the first
    norm_local, updates_local, _ = one_step([first, second], per_micro_batch_mean=True)
    assert norm_local != pytest.approx(norm_one, rel=1e-2)
    assert max((a - b).abs().max().item() for a, b in zip(updates_local, updates_one)) > 1e-3
