"""Exact values of the reward-model and PRM losses on small hand-checked tensors."""

import math

import pytest
import torch

from configs import DataError
from stages.data_prep.tiny_model import STEP, train_tokenizer
from stages.prm.losses import prm_loss, step_logits
from stages.prm.stage import encode_prm_row
from stages.rm.losses import pairwise_loss
from stages.rm.stage import pair_batch, reward_stats


def test_pairwise_loss_is_mean_neg_log_sigmoid_of_the_difference():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.0])
    # -log sigmoid(1) = log(1 + e^-1) = 0.3132617; -log sigmoid(0) = log 2 = 0.6931472
    expected = (math.log(1 + math.exp(-1)) + math.log(2)) / 2
    assert pairwise_loss(chosen, rejected).item() == pytest.approx(expected, abs=1e-6)


def test_pairwise_loss_subtracts_the_margin():
    chosen, rejected, margin = torch.tensor([3.0]), torch.tensor([1.0]), torch.tensor([1.0])
    assert pairwise_loss(chosen, rejected, margin).item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)


def test_pair_batch_puts_chosen_first_and_right_pads():
    batch = pair_batch([([1, 2, 3], [1, 2], 0.5), ([4], [5, 6], 0.0)], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0], [1, 2, 0], [5, 6, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert batch["margin"].tolist() == [0.5, 0.0]


def test_reward_stats_single_rank():
    mean, std = reward_stats(torch.tensor([1.0, 3.0]), world=1)
    assert (mean, std) == (2.0, 1.0)


def test_step_logits_select_reward_tokens_at_labelled_positions():
    good, bad = 1, 2
    logits = torch.zeros(1, 4, 5)
    logits[0, 1, good], logits[0, 1, bad] = 2.0, 0.0  # a "good" step
    logits[0, 3, good], logits[0, 3, bad] = 0.0, 1.0  # a "bad" step
    labels = torch.tensor([[-100, good, -100, bad]])
    selected, target = step_logits(logits, labels, (good, bad))
    assert selected.tolist() == [[2.0, 0.0], [0.0, 1.0]]
    assert target.tolist() == [0, 1]
    loss, correct = prm_loss(logits, labels, (good, bad))
    # CE([2,0], 0) = log(1 + e^-2); CE([0,1], 1) = log(1 + e^-1)
    assert loss.item() == pytest.approx((math.log(1 + math.exp(-2)) + math.log(1 + math.exp(-1))) / 2, abs=1e-6)
    assert correct.tolist() == [1.0, 1.0]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["Compute 1+2\n1+2=3\nAnswer: 3", "Compute 9-4\n9-4=5"], 64)


def test_encode_prm_row_labels_only_the_placeholders(tok):
    row = {"prompt": "Compute 1+2\n", "response": f"1+2=3{STEP}\nAnswer: 4{STEP}\n", "labels": ["+", "-"]}
    ph = tok.convert_tokens_to_ids(STEP)
    plus, minus = tok.convert_tokens_to_ids("+"), tok.convert_tokens_to_ids("-")
    ids, labels = encode_prm_row(tok, row, ph, (plus, minus), ("+", "-"), "prm row 0")
    positions = [i for i, t in enumerate(ids) if t == ph]
    assert [labels[p] for p in positions] == [plus, minus]
    assert all(lab == -100 for i, lab in enumerate(labels) if i not in positions)


def test_encode_prm_row_rejects_mismatched_labels(tok):
    ph = tok.convert_tokens_to_ids(STEP)
    ids = (tok.convert_tokens_to_ids("+"), tok.convert_tokens_to_ids("-"))
    with pytest.raises(DataError, match=r"prm row 3: 1 step placeholders but 2 labels"):
        encode_prm_row(tok, {"prompt": "", "response": f"1+2=3{STEP}", "labels": ["+", "+"]}, ph, ids, ("+", "-"), "prm row 3")
    with pytest.raises(DataError, match=r"label '\?' is not one of prm.reward_tokens"):
        encode_prm_row(tok, {"prompt": "", "response": f"1+2=3{STEP}", "labels": ["?"]}, ph, ids, ("+", "-"), "prm row 4")
