"""stages/rl/experience.py: the token layout the trainer sees equals what the engine sampled."""

import pytest
import torch

from stages.data_prep.tiny_model import train_tokenizer
from stages.rl.experience import (
    Sample,
    micro_batches,
    place_on_actions,
    sequence_batch,
    shard,
    step_end_tokens,
    trim,
)

PAD = 0
SAMPLES = [Sample([5, 6, 7], [8, 9], [-0.1, -0.2]), Sample([5, 6], [8, 9, 10, 11], [-0.3, -0.4, -0.5, -0.6])]


def test_sequence_batch_layout():
    b = sequence_batch(SAMPLES, PAD)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0], [5, 6, 8, 9, 10, 11]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    # column t predicts token t+1: row 0's response tokens sit at 3 and 4, so its actions are columns 2 and 3
    assert b["action_mask"].tolist() == [[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert b["rollout_log_probs"].tolist()[0] == pytest.approx([0, 0, -0.1, -0.2, 0])
    assert b["rollout_log_probs"].tolist()[1] == pytest.approx([0, -0.3, -0.4, -0.5, -0.6])


def test_actions_line_up_with_the_sampled_tokens():
    b = sequence_batch(SAMPLES, PAD)
    targets = b["input_ids"][:, 1:]
    assert targets[b["action_mask"].bool()].tolist() == [8, 9, 8, 9, 10, 11]


def test_place_on_actions():
    out = place_on_actions([[1.0, 2.0], [3.0]], [[0, 1], [3]], SAMPLES, width=5)
    assert out.tolist() == [[0, 0, 1.0, 2.0, 0], [0, 0, 0, 0, 3.0]]


def test_shard_and_micro_batches():
    batch = {"x": torch.arange(6).unsqueeze(1), "y": torch.arange(6)}
    parts = shard(batch, 3)
    assert [p["y"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="does not split over 4"):
        shard(batch, 4)
    assert [m["y"].tolist() for m in micro_batches(batch, 4)] == [[0, 1, 2, 3], [4, 5]]
    shuffled = [m["y"].tolist() for m in micro_batches(batch, 4, torch.Generator().manual_seed(0))]
    again = [m["y"].tolist() for m in micro_batches(batch, 4, torch.Generator().manual_seed(0))]
    assert shuffled == again and sorted(y for m in shuffled for y in m) == list(range(6))
    for m in micro_batches(batch, 4, torch.Generator().manual_seed(0)):
        assert m["x"].flatten().tolist() == m["y"].tolist()  # rows stay whole


def test_trim_drops_unused_padding_columns():
    b = sequence_batch([SAMPLES[0], Sample([5], [8], [-1.0])], PAD)
    t = trim(b)
    assert t["input_ids"].shape == (2, 5) and t["action_mask"].shape == (2, 4)
    assert trim({**b, "kl_coef": torch.ones(2)})["kl_coef"].shape == (2,)


def test_step_end_tokens_with_the_tiny_tokenizer():
    tok = train_tokenizer(["12+5=17\n17-3=14\nAnswer: 14"] * 10, vocab_size=96)
    ids = tok("12+5=17\n17-3=14\nAnswer: 14", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ends = step_end_tokens(tok, ids, "\n")
    assert len(ends) == 3
    pieces = [tok.decode(ids[: e + 1]) for e in ends]
    assert pieces == ["12+5=17", "12+5=17\n17-3=14", "12+5=17\n17-3=14\nAnswer: 14"]
