"""`<stage>.packing`: a right-padded batch as one padding-free row gives each stage the padded batch's
losses and gradients (the helper in stages/common/packing.py, then every trained stage's loss code on
a tiny Llama), and a model family that cannot keep packed samples apart is refused by name."""

import json

import pytest
import torch
from transformers import LlamaForSequenceClassification, LlamaForTokenClassification

from configs import load_config
from configs.errors import ConfigError
from configs.schema import DPOConfig, RLConfig
from stages.common import packing
from stages.dag import preflight
from stages.dpo import stage as dpo
from stages.prm import losses as prm
from stages.rl.losses import value_loss
from stages.rl.workers import actor_loss, critic_values, token_log_probs
from stages.rm import stage as reward_model
from tests.same_gradients import assert_same_loss_and_grads
from tests.tiny_llama import tiny

TOL = 1e-5
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])


def test_pack_keeps_the_attended_tokens_with_positions_restarting_per_sample():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    packed = packing.pack(ids, MASK)
    assert packed["input_ids"].tolist() == [[5, 6, 7, 8, 9, 1, 2, 3, 4]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]


def test_unpack_puts_each_token_back_in_its_padded_place_with_zeros_at_the_pads():
    values = torch.arange(1.0, 10.0).reshape(1, 9, 1).expand(1, 9, 2)
    out = packing.unpack(values, MASK)
    assert out[..., 0].tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]]
    assert torch.equal(out[..., 1], out[..., 0])


def test_unpack_passes_the_gradient_back_to_the_packed_row_and_none_from_the_pads():
    values = torch.zeros(1, 9, requires_grad=True)
    (packing.unpack(values, MASK) * torch.arange(12.0).reshape(3, 4)).sum().backward()
    assert values.grad.tolist() == [[0, 1, 2, 4, 5, 8, 9, 10, 11]]


def test_last_tokens_read_each_samples_own_last_token():
    values = torch.arange(1.0, 10.0).reshape(1, 9)
    assert packing.last_tokens(values, MASK).tolist() == [3, 5, 9]
    one_token = torch.tensor([[1, 0], [1, 0], [1, 1]])  # one-token samples, then a sample of two
    assert packing.last_tokens(torch.tensor([[7.0, 8.0, 9.0, 10.0]]), one_token).tolist() == [7, 8, 10]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_transformers_keeps_packed_samples_apart_from_position_ids_alone(attn):
    """What packing rests on, for both CPU attention implementations of the installed transformers: a row
    with restarting position ids and no attention mask scores each sample as if it were alone."""
    model = tiny(attn=attn).eval()
    a, b = torch.tensor([[3, 9, 4, 7, 1]]), torch.tensor([[8, 2, 6]])
    row = model(input_ids=torch.cat([a, b], 1), position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]]), use_cache=False)
    alone = torch.cat([model(input_ids=a, use_cache=False).logits, model(input_ids=b, use_cache=False).logits], 1)
    assert torch.allclose(row.logits, alone, atol=1e-6)


def rows(lengths: list[int], seed: int, vocab: int = 64) -> dict[str, torch.Tensor]:
    """Right-padded random rows of the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": torch.randint(1, vocab, mask.shape, generator=gen) * mask, "attention_mask": mask}


def test_rm_packed_rewards_loss_and_gradients_equal_the_padded_batch():
    batch = rows([7, 4, 9, 2, 5, 6], seed=1) | {"margin": torch.tensor([0.0, 0.5, 0.0])}

    def loss(model, packed):
        return reward_model.bt_loss(reward_model.LastTokenReward(model, packed), batch)[0]

    assert_same_loss_and_grads(lambda: tiny(LlamaForSequenceClassification, num_labels=1), loss, False, True, TOL)
    model = tiny(LlamaForSequenceClassification, num_labels=1)
    rewards = [reward_model.rewards_of(reward_model.LastTokenReward(model, p), batch) for p in (False, True)]
    assert torch.allclose(rewards[0], rewards[1], atol=TOL)


def test_prm_packed_loss_and_gradients_equal_the_padded_batch():
    batch = rows([8, 5, 10], seed=2)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 3], labels[0, 7], labels[1, 4], labels[2, 2], labels[2, 9] = 5, 6, 6, 5, 5  # a label at each "step"

    def loss(model, packed):
        return prm.prm_loss(packing.logits(model, batch, packed), labels, (5, 6))[0]

    assert_same_loss_and_grads(tiny, loss, False, True, TOL)


PAIRS = [(([3, 4, 5], [6, 7]), ([3, 4, 5], [8, 9, 10, 11])),
         (([12, 13], [14, 15, 16, 17, 18]), ([12, 13], [19])),
         (([20, 21, 22, 23], [24]), ([20, 21, 22, 23], [25, 26, 27]))]


@pytest.mark.parametrize("loss_name", ["sigmoid", "ipo"])
def test_dpo_packed_pair_loss_and_gradients_equal_the_padded_rows(loss_name):
    def loss(model, packed):
        cfg = DPOConfig(loss=loss_name, nll_loss_coef=0.3, packing=packed)
        objective = dpo.PairObjective(cfg, PAIRS, pad_id=0, shared_prompt=packed)  # padded: two rows per pair
        assert not objective.shared_prompt  # packing takes the place of the shared-prompt rows
        ref = -torch.arange(1.0, 7.0)
        return objective.loss(model, objective.collate(ref, [0, 1, 2]))[0]

    assert_same_loss_and_grads(tiny, loss, False, True, TOL)


def test_kto_packed_loss_and_gradients_equal_the_padded_rows():
    def loss(model, packed):
        objective = dpo.KTOObjective(DPOConfig(loss="kto", packing=packed), PAIRS, pad_id=0, world=1)
        ref = -torch.arange(1.0, 13.0) / 2
        return objective.loss(model, objective.collate(ref, [0, 1, 2, 3, 5]))[0]

    assert_same_loss_and_grads(tiny, loss, False, True, TOL)


def test_dpo_packed_reference_log_probs_equal_the_padded_ones():
    model, seqs = tiny(), [s for pair in PAIRS for s in pair]
    with torch.no_grad():
        padded, packed = (dpo.reference_logps(model, seqs, 4, 0, 0, 1, packed=p) for p in (False, True))
    assert torch.allclose(packed, padded, atol=TOL)


def rl_batch() -> dict[str, torch.Tensor]:
    """Prompts of 3 tokens and responses of 5, 1, 6 and 2 tokens, right-padded as experience makes them."""
    batch = rows([8, 4, 9, 5], seed=3)
    gen = torch.Generator().manual_seed(4)
    action_mask = torch.zeros(4, 8)
    for i, n in enumerate([5, 1, 6, 2]):
        action_mask[i, 2 : 2 + n] = 1
    return batch | {
        "action_mask": action_mask,
        "advantages": torch.randn(4, 8, generator=gen) * action_mask,
        "old_log_probs": (-4 + torch.randn(4, 8, generator=gen)) * action_mask,
        "rollout_log_probs": (-4 + torch.randn(4, 8, generator=gen)) * action_mask,
        "ref_log_probs": (-4 + torch.randn(4, 8, generator=gen)) * action_mask,
        "kl_coef": torch.full((4,), 0.1),
        "values": torch.randn(4, 8, generator=gen) * action_mask,
        "returns": torch.randn(4, 8, generator=gen) * action_mask,
    }


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum_norm"])
def test_rl_packed_policy_loss_and_gradients_equal_the_padded_batch(aggregation):
    batch = rl_batch()

    def loss(model, packed):
        rl = RLConfig(algorithm={"use_kl_loss": True, "kl_estimator": "k3", "entropy_coef": 0.01, "rollout_is_cap": 2.0,
                                 "loss_aggregation": aggregation}, packing=packed, shared_prompt=False)
        return actor_loss(model, batch, rl, units=None)[0]

    assert_same_loss_and_grads(tiny, loss, False, True, TOL)


def test_rl_packed_log_prob_passes_equal_the_padded_ones():
    model, batch = tiny(), rl_batch()
    with torch.no_grad():
        padded, packed = (token_log_probs(model, batch, 0.7, layout=p) * batch["action_mask"] for p in ("padded", "packed"))
    assert torch.allclose(packed, padded, atol=TOL)


def test_rl_packed_critic_values_loss_and_gradients_equal_the_padded_batch():
    batch = rl_batch()

    def loss(model, packed):
        values = critic_values(model, batch, "packed" if packed else "padded")
        return value_loss(values, batch["values"], batch["returns"], batch["action_mask"], 0.2)

    critic = lambda: tiny(LlamaForTokenClassification, num_labels=1, classifier_dropout=0.0)  # noqa: E731
    assert_same_loss_and_grads(critic, loss, False, True, TOL)


def test_packing_with_a_family_that_takes_no_position_ids_is_refused_by_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^rm\.packing=true: BloomForCausalLM takes no position ids, .*set rm\.packing=false$"):
        packing.check({"model_type": "bloom"}, "rm.packing")
    packing.check({"model_type": "llama"}, "rm.packing")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mpt"}))
    cfg = load_config(None, [f"model.name_or_path={tmp_path}", "rl.packing=true"])
    with pytest.raises(ConfigError, match=r"^rl\.packing=true: MptForCausalLM"):
        preflight.check_model_family(cfg)
    preflight.check_model_family(load_config(None, [f"model.name_or_path={tmp_path}"]))  # packing off: nothing to refuse
