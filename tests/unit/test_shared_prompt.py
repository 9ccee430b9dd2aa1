"""`rl.shared_prompt`: a prompt's samples computed as one row (stages/common/shared_prompt.py) give the
padded rows' outputs, losses and gradients; training micro-batches keep a prompt's samples together;
the layout falls back to padded rows where it cannot be exact."""

import pytest
import torch
from transformers import LlamaForTokenClassification

from configs.schema import RLConfig
from stages.common import shared_prompt
from stages.rl.experience import Sample, micro_batches, prompt_lengths, sequence_batch
from stages.rl.losses import value_loss
from stages.rl.workers import actor_loss, critic_values, row_layout, token_log_probs
from tests.same_gradients import assert_same_loss_and_grads
from tests.tiny_llama import tiny

TOL = 1e-5


def rollout(prompts: list[list[int]], lengths: list[list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    """A GRPO-style batch: each prompt's samples (responses of the given lengths) in adjacent rows, with
    the per-token tensors the policy and critic losses read."""
    gen = torch.Generator().manual_seed(seed)
    samples = [Sample(p, torch.randint(1, 64, (n,), generator=gen).tolist(), [0.0] * n)
               for p, ns in zip(prompts, lengths) for n in ns]
    batch = sequence_batch(samples, pad_id=0)
    mask = batch["action_mask"]
    b = mask.shape[0]
    return batch | {
        "advantages": torch.randn(mask.shape, generator=gen) * mask,
        "old_log_probs": (-4 + torch.randn(mask.shape, generator=gen)) * mask,
        "rollout_log_probs": (-4 + torch.randn(mask.shape, generator=gen)) * mask,
        "ref_log_probs": (-4 + torch.randn(mask.shape, generator=gen)) * mask,
        "kl_coef": torch.full((b,), 0.1),
        "values": torch.randn(mask.shape, generator=gen) * mask,
        "returns": torch.randn(mask.shape, generator=gen) * mask,
    }


PROMPTS = [[5, 9, 3], [7, 2, 8, 8, 4, 1], [6]]
LENGTHS = [[4, 1, 7], [2, 5], [3, 3, 6, 1]]


def test_layout_puts_each_prompt_once_and_each_response_after_it_with_restarting_positions():
    batch = rollout([[5, 9], [7]], [[2, 3], [1]])
    rows = shared_prompt.layout(batch["input_ids"], batch["attention_mask"], prompt_lengths(batch))
    ids = batch["input_ids"]
    assert rows.input_ids.tolist() == [[5, 9, *ids[0, 2:4].tolist(), *ids[1, 2:5].tolist()],
                                       [7, ids[2, 1].item(), 0, 0, 0, 0, 0]]
    assert rows.position_ids[0].tolist() == [0, 1, 2, 3, 2, 3, 4]
    assert rows.row.tolist() == [0, 0, 1]
    assert rows.col[1].tolist() == [0, 1, 4, 5, 6]  # the second sample reads the prompt, then its own tokens
    first = rows.mask[0, 0]
    assert first[4].tolist() == [True, True, False, False, True, False, False]  # sees the prompt, not sample 1
    assert first[6].tolist() == [True, True, False, False, True, True, True]
    assert rows.mask[1, 0, 3].tolist() == [False, False, False, True, False, False, False]  # a pad sees itself


def test_rows_that_share_a_prompt_need_not_be_adjacent():
    batch = rollout([[5, 9], [7], [5, 9]], [[2], [3], [4]])
    rows = shared_prompt.layout(batch["input_ids"], batch["attention_mask"], prompt_lengths(batch))
    assert rows.row.tolist() == [0, 1, 0]
    assert rows.input_ids.shape[0] == 2


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_log_prob_passes_on_shared_rows_equal_the_padded_ones(attn):
    model, batch = tiny(attn=attn).eval(), rollout(PROMPTS, LENGTHS)
    with torch.no_grad():
        padded, shared = (token_log_probs(model, batch, 0.7, layout=lay) * batch["action_mask"] for lay in ("padded", "shared"))
    assert torch.allclose(shared, padded, atol=TOL)
    assert padded.abs().sum() > 0


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_sum_norm"])
def test_policy_loss_and_gradients_on_shared_rows_equal_the_padded_batch(aggregation):
    batch = rollout(PROMPTS, LENGTHS, seed=1)

    def loss(model, layout):
        rl = RLConfig(algorithm={"use_kl_loss": True, "kl_estimator": "k3", "entropy_coef": 0.01, "rollout_is_cap": 2.0,
                                 "loss_aggregation": aggregation}, shared_prompt=layout == "shared")
        assert row_layout(rl, model) == layout
        return actor_loss(model, batch, rl, units=None)[0]

    assert_same_loss_and_grads(tiny, loss, "padded", "shared", TOL)


def test_critic_values_loss_and_gradients_on_shared_rows_equal_the_padded_batch():
    batch = rollout(PROMPTS, LENGTHS, seed=2)

    def loss(model, layout):
        values = critic_values(model, batch, layout)
        return value_loss(values, batch["values"], batch["returns"], batch["action_mask"], 0.2)

    critic = lambda: tiny(LlamaForTokenClassification, num_labels=1, classifier_dropout=0.0)  # noqa: E731
    assert_same_loss_and_grads(critic, loss, "padded", "shared", TOL)


def test_a_multi_turn_row_shares_only_the_tokens_before_its_first_action():
    """An agent episode's response holds environment tokens (not trained): the split is at the first
    sampled token, and the observations stay in each row's own part."""
    samples = [Sample([4, 5], [9, 9, 30, 31, 9], [0.0] * 5, trained=[1, 1, 0, 0, 1]),
               Sample([4, 5], [8, 30, 31, 8], [0.0] * 4, trained=[1, 0, 0, 1])]
    batch = sequence_batch(samples, pad_id=0)
    assert prompt_lengths(batch).tolist() == [2, 2]
    model = tiny().eval()
    with torch.no_grad():
        padded, shared = (token_log_probs(model, batch, 1.0, layout=lay) * batch["action_mask"] for lay in ("padded", "shared"))
    assert torch.allclose(shared, padded, atol=TOL)


def test_training_micro_batches_hold_whole_groups_in_a_seeded_order():
    batch = {"x": torch.arange(12)}
    micros = [m["x"].tolist() for m in micro_batches(batch, 6, torch.Generator().manual_seed(3), group=3)]
    assert sorted(x for m in micros for x in m) == list(range(12))
    for m in micros:
        assert [m[i : i + 3] for i in (0, 3)] == [list(range(m[i], m[i] + 3)) for i in (0, 3)]
        assert all(part[0] % 3 == 0 for part in (m[:3], m[3:]))
    again = [m["x"].tolist() for m in micro_batches(batch, 6, torch.Generator().manual_seed(3), group=3)]
    assert again == micros


def flash(model):
    model.config._attn_implementation = "flash_attention_2"  # as loaded on a GPU with flash-attn (not here)
    return model


@pytest.mark.parametrize(("model", "rl", "aux"), [
    (lambda: flash(tiny()), RLConfig(), None),  # takes no 4D mask
    (lambda: tiny(sliding_window=4, layer_types=["sliding_attention"] * 2), RLConfig(), None),
    (tiny, RLConfig(), []),  # an MoE router loss: its token mean would count a shared prompt once
    (tiny, RLConfig(shared_prompt=False), None),
])
def test_the_layout_stays_padded_where_shared_rows_would_not_be_exact(model, rl, aux):
    assert row_layout(rl, model(), aux) == "padded"
    assert row_layout(RLConfig(packing=True), model(), aux) == "packed"
