"""RL's critic started from a reward model (rl.critic.init_from) and kept as a value network
(rl.critic.save_value_network), its worker driven in this process as `stages/rl/in_process.py` drives it: the
values it starts with are the RM's rewards at the same tokens, and the checkpoint it leaves gives the values it
ended with. (The RL stage with both: tests/stage/test_rl_algorithms.py.)"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForTokenClassification

from configs import load_config
from stages.common.checkpoint import load_tokenizer
from stages.dag.contract import NodeInputs
from stages.data.prepared import read_split
from stages.data.tokenization import last_token_index
from stages.rewards.rm_scorer import load_reward_model
from stages.rl.experience import Sample, sequence_batch
from stages.rl.workers import CriticWorker
from stages.rm import stage as rm_stage
from tests.stage.conftest import FAST, make_ctx

CRITIC = [*FAST, "rl.algorithm.advantage_estimator=gae", "rl.rollout.batch_size=2", "rl.rollout.n_samples_per_prompt=2",
          "rl.train_batch_size=4", "rl.micro_train_batch_size=4", "rl.rollout.micro_batch_size=4", "rl.critic.lr=1e-2"]


@pytest.fixture(scope="module")
def normalizing_rm(prepared, tmp_path_factory) -> Path:
    """A 4-step reward model whose config normalizes its rewards (rm.normalize_reward)."""
    cfg = load_config(None, [*FAST, "rm.max_steps=4", "rm.eval_every=2", "rm.save_every=2", "rm.normalize_reward=true"])
    ctx = make_ctx("rm", cfg, tmp_path_factory.mktemp("rm"))
    return rm_stage.run(ctx, {"sft_model": prepared["base_model"], "pref_data": prepared["pref_data"]}).outputs["reward_model"]


def rollout(tokenizer, prepared) -> dict[str, torch.Tensor]:
    """Two held-out prompts, each with its chosen and its rejected response ending in EOS: a rollout's batch."""
    samples = []
    for row in read_split(prepared["pref_data"], "eval")[:2]:
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        for response in (row["chosen"], row["rejected"]):
            ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            samples.append(Sample(prompt, ids, [0.0] * len(ids)))
    return sequence_batch(samples, tokenizer.pad_token_id)


@contextmanager
def critic_worker(cfg, inputs: dict[str, Path]):
    """One critic rank, set up as the RL stage sets it up."""
    worker = CriticWorker(0, 1, torch.get_num_threads())
    given = NodeInputs({name: str(path) for name, path in inputs.items()})
    worker.setup(cfg, given, cfg.rl.critic, 1, worker.master(), os.getcwd())
    try:
        yield worker
    finally:
        worker.close()


def test_a_critic_from_the_reward_model_starts_with_its_rewards_at_every_token(prepared, normalizing_rm):
    """Value t is the state after tokens 0..t: the RM's (normalized) reward of the text ids[:t+1]."""
    rm = load_reward_model(normalizing_rm, "cpu")
    assert rm.normalize and abs(rm.std - 1.0) > 1e-3  # the normalization is part of what the critic starts from
    batch = rollout(rm.tokenizer, prepared)
    cfg = load_config(None, [*CRITIC, "rl.critic.init_from=reward_model"])
    with critic_worker(cfg, {"sft_model": prepared["base_model"], "reward_model": normalizing_rm}) as worker:
        values = worker.values(batch)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    for row in range(len(ids)):
        n = int(mask[row].sum())
        rewards = torch.cat([rm(ids[row : row + 1, : t + 1], mask[row : row + 1, : t + 1]) for t in range(n - 1)])
        torch.testing.assert_close(values[row, : n - 1], (rewards - rm.mean) / rm.std, atol=1e-4, rtol=1e-4)


def test_a_critic_from_a_reward_model_read_raw_starts_at_its_raw_rewards(prepared, normalizing_rm):
    """reward.normalize=false: RL reads the RM's raw rewards, and the critic starts at them, not at the z-scores
    the checkpoint's own normalize_reward would give (OpenRLHF's critic follows --reward.normalize_enable)."""
    rm = load_reward_model(normalizing_rm, "cpu")
    batch = rollout(rm.tokenizer, prepared)
    cfg = load_config(None, [*CRITIC, "rl.critic.init_from=reward_model", "reward.source=rm", "reward.normalize=false"])
    with critic_worker(cfg, {"sft_model": prepared["base_model"], "reward_model": normalizing_rm}) as worker:
        values = worker.values(batch)
    n = int(batch["attention_mask"][0].sum())
    rewards = torch.cat([rm(batch["input_ids"][:1, : t + 1], batch["attention_mask"][:1, : t + 1]) for t in range(n - 1)])
    torch.testing.assert_close(values[0, : n - 1], rewards, atol=1e-4, rtol=1e-4)


def test_a_critic_from_the_sft_model_does_not_start_at_the_reward_models_values(prepared, normalizing_rm):
    rm = load_reward_model(normalizing_rm, "cpu")
    batch = rollout(rm.tokenizer, prepared)
    with critic_worker(load_config(None, CRITIC), {"sft_model": prepared["base_model"]}) as worker:
        values = worker.values(batch)
    n = int(batch["attention_mask"][0].sum())
    rewards = torch.cat([rm(batch["input_ids"][:1, : t + 1], batch["attention_mask"][:1, : t + 1]) for t in range(n - 1)])
    assert float(((rewards - rm.mean) / rm.std - values[0, : n - 1]).abs().max()) > 1e-2


@pytest.mark.parametrize("lora", [[], ["rl.critic.lora.rank=4", "rl.critic.lora.alpha=8"]], ids=["whole", "lora"])
def test_the_saved_value_network_gives_the_values_the_trained_critic_ended_with(prepared, tmp_path, lora):
    """One training step moves the critic's values; the checkpoint it exports (LoRA adapters merged in) gives the
    moved values, per token with AutoModelForTokenClassification and at the last token with the RM loader."""
    cfg = load_config(None, [*CRITIC, "rl.critic.save_value_network=true", *lora])
    batch = rollout(load_tokenizer(prepared["base_model"]), prepared)
    out = tmp_path / "critic_model"
    with critic_worker(cfg, {"sft_model": prepared["base_model"]}) as worker:
        before = worker.values(batch)
        worker.train(batch | {"values": before, "returns": torch.ones_like(before)}, 0)
        after = worker.values(batch)
        worker.export(str(out))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    states = mask[:, :-1].bool()  # value t: the state after tokens 0..t, real where token t is
    assert float((after - before)[states].abs().max()) > 1e-3  # it trained
    saved = AutoModelForTokenClassification.from_pretrained(out).eval()
    with torch.no_grad():
        per_token = saved(input_ids=ids, attention_mask=mask).logits[..., 0]
    torch.testing.assert_close(per_token[:, :-1][states], after[states], atol=1e-5, rtol=1e-4)
    as_rm = load_reward_model(out, "cpu")
    last = per_token[torch.arange(len(ids)), last_token_index(mask)]
    torch.testing.assert_close(as_rm(ids, mask), last, atol=1e-5, rtol=1e-4)
    assert not (out / "adapter_config.json").exists()  # whole, not an adapter
