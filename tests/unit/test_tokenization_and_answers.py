"""stages/data/tokenization.py (segment encoding, padding) and stages/common/answers.py."""

from __future__ import annotations

import pytest
import torch

from stages.common.answers import extract_answer, is_correct
from stages.data.tokenization import IGNORE_INDEX, encode_segments, pad_batch
from stages.data_prep.tiny_model import PAD, train_tokenizer
from tests.markers import cpu_only

PATTERN = r"Answer:\s*(-?\d+)"


@pytest.fixture(scope="module")
def tok():
    corpus = ["Compute 17+5-8", "17+5=22\n22-8=14\nAnswer: 14", "Answer: 3", "Compute 9-4"]
    return train_tokenizer(corpus, vocab_size=60)


def ids_of(tok, tokens: list[str]) -> list[int]:
    ids = tok.convert_tokens_to_ids(tokens)
    assert tok.unk_token_id not in ids, tokens
    return ids


# --- the tokenizer we build on -------------------------------------------------------------


def test_tokenizer_keeps_digits_single_and_merges_words(tok):
    assert tok.pad_token == PAD
    assert tok.pad_token_id == 0
    assert tok.convert_ids_to_tokens(tok("Compute 12+3", add_special_tokens=False)["input_ids"]) == [
        "Compute",
        " ",
        "1",
        "2",
        "+",
        "3",
    ]
    assert tok.convert_ids_to_tokens(tok("Answer: 14", add_special_tokens=False)["input_ids"]) == [
        "Answer:",
        " ",
        "1",
        "4",
    ]


# --- encode_segments -----------------------------------------------------------------------


def test_encode_segments_masks_untrained_segments(tok):
    ids, labels = encode_segments(tok, ["Compute 1+2", "\n1+2=3"], [False, True])
    prompt = ids_of(tok, ["Compute", " ", "1", "+", "2"])
    response = ids_of(tok, ["\n", "1", "+", "2", "=", "3"])
    assert ids == prompt + response
    assert labels == [IGNORE_INDEX] * 5 + response
    assert IGNORE_INDEX == -100


def test_encode_segments_all_trained_and_none_trained(tok):
    ids, labels = encode_segments(tok, ["Answer: 3"], [True])
    assert ids == labels == ids_of(tok, ["Answer:", " ", "3"])
    ids, labels = encode_segments(tok, ["Answer: 3"], [False])
    assert ids == ids_of(tok, ["Answer:", " ", "3"])
    assert labels == [-100, -100, -100]


def test_encode_segments_interleaved(tok):
    ids, labels = encode_segments(tok, ["1", "+", "2", "=3"], [True, False, True, False])
    one, plus, two, eq, three = ids_of(tok, ["1", "+", "2", "=", "3"])
    assert ids == [one, plus, two, eq, three]
    assert labels == [one, -100, two, -100, -100]


def test_encode_segments_never_merges_across_segments(tok):
    whole, _ = encode_segments(tok, ["Compute"], [True])
    split, labels = encode_segments(tok, ["Comp", "ute"], [False, True])
    assert whole == ids_of(tok, ["Compute"])
    assert len(split) > 1 and split != whole
    assert split == tok("Comp", add_special_tokens=False)["input_ids"] + tok("ute", add_special_tokens=False)["input_ids"]
    n_comp = len(tok("Comp", add_special_tokens=False)["input_ids"])
    assert labels == [-100] * n_comp + split[n_comp:]


def test_encode_segments_adds_no_special_tokens(tok):
    ids, _ = encode_segments(tok, ["1"], [True])
    assert ids == ids_of(tok, ["1"])
    assert tok.bos_token_id not in ids and tok.eos_token_id not in ids


def test_encode_segments_empty(tok):
    assert encode_segments(tok, [], []) == ([], [])
    assert encode_segments(tok, [""], [True]) == ([], [])


def test_encode_segments_length_mismatch_raises(tok):
    with pytest.raises(ValueError, match="shorter than argument 1"):  # zip(strict=True)'s
        encode_segments(tok, ["a", "b"], [True])


# --- pad_batch -----------------------------------------------------------------------------


def test_pad_batch_right_pads_exactly():
    rows = [([5, 6, 7], [-100, 6, 7]), ([8], [8])]
    batch = pad_batch(rows, pad_id=0)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7], [8, 0, 0]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1], [1, 0, 0]]))
    assert torch.equal(batch["labels"], torch.tensor([[-100, 6, 7], [8, -100, -100]]))
    for t in batch.values():
        assert t.dtype == torch.long


def test_pad_batch_uses_given_pad_id_and_widest_row():
    rows = [([1], [-100]), ([2, 3, 4, 5], [2, 3, 4, 5]), ([6, 7], [-100, 7])]
    batch = pad_batch(rows, pad_id=9)
    assert batch["input_ids"].shape == (3, 4)
    assert torch.equal(batch["input_ids"], torch.tensor([[1, 9, 9, 9], [2, 3, 4, 5], [6, 7, 9, 9]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]))
    assert torch.equal(
        batch["labels"], torch.tensor([[-100, -100, -100, -100], [2, 3, 4, 5], [-100, 7, -100, -100]])
    )


def test_pad_batch_single_row_no_padding():
    batch = pad_batch([([3, 4], [3, 4])], pad_id=0)
    assert torch.equal(batch["input_ids"], torch.tensor([[3, 4]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1]]))
    assert torch.equal(batch["labels"], torch.tensor([[3, 4]]))


def test_pad_batch_of_encoded_rows(tok):
    a = encode_segments(tok, ["Compute 1+2", "\n3"], [False, True])
    b = encode_segments(tok, ["Compute 9", "\n9"], [False, True])
    batch = pad_batch([a, b], tok.pad_token_id)
    assert batch["input_ids"].shape == (2, 7)
    assert batch["input_ids"][1].tolist() == b[0] + [tok.pad_token_id] * 2
    assert batch["labels"][1].tolist() == [-100, -100, -100, *ids_of(tok, ["\n", "9"]), -100, -100]
    assert batch["attention_mask"].sum().item() == 7 + 5


# --- answers -------------------------------------------------------------------------------


def test_extract_answer_last_match_group():
    assert extract_answer("17+5=22\n22-8=14\nAnswer: 14", PATTERN) == "14"
    assert extract_answer("Answer: 3\nno wait\nAnswer: 14", PATTERN) == "14"
    assert extract_answer("Answer:-2", PATTERN) == "-2"
    assert extract_answer("Answer:\n  7", PATTERN) == "7"


def test_extract_answer_none_when_absent():
    assert extract_answer("", PATTERN) is None
    assert extract_answer("22-8=14", PATTERN) is None
    assert extract_answer("Answer: fourteen", PATTERN) is None


def test_extract_answer_first_group_of_multi_group_pattern():
    assert extract_answer("x=1 y=2; x=3 y=4", r"x=(\d) y=(\d)") == "3"


def test_extract_answer_pattern_without_group_and_stripping():
    assert extract_answer("a 12 b 34", r"\d+") == "34"
    assert extract_answer("Answer:  42  \n", r"Answer:(.*)") == "42"


def test_is_correct():
    assert is_correct("Answer: 14", "14", PATTERN)
    assert is_correct("Answer: 14", " 14\n", PATTERN)
    assert is_correct("Answer: 1\nAnswer: 14", "14", PATTERN)
    assert is_correct("Answer: -2", "-2", PATTERN)
    assert not is_correct("Answer: 14\nAnswer: 1", "14", PATTERN)
    assert not is_correct("Answer: 15", "14", PATTERN)
    assert not is_correct("Answer: 140", "14", PATTERN)
    assert not is_correct("no answer here", "14", PATTERN)
    assert not is_correct("", "", PATTERN)


@cpu_only
def test_attention_auto_is_sdpa_without_a_gpu_and_flash_attention_is_refused():
    from configs.errors import CheckpointError
    from configs.schema import ModelConfig
    from stages.common.checkpoint import attn_implementation

    assert attn_implementation(ModelConfig()) == "sdpa"
    assert attn_implementation(ModelConfig(attn_implementation="eager")) == "eager"
    with pytest.raises(CheckpointError, match="flash_attention_2 needs a CUDA GPU"):
        attn_implementation(ModelConfig(attn_implementation="flash_attention_2"))


def test_a_packed_row_scores_as_the_padded_batch():
    from transformers import LlamaConfig, LlamaForCausalLM

    from stages.data.tokenization import pack_batch

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=4, vocab_size=50))
    rows = [([5, 6, 7, 8], [-100, -100, 7, 8]), ([9, 10, 11, 12, 13, 14], [-100, 10, 11, 12, 13, 14]), ([3, 4], [3, 4])]
    packed = pack_batch(rows)
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1]]
    assert packed["labels"].tolist() == [[-100, -100, 7, 8, -100, 10, 11, 12, 13, 14, -100, 4]]
    padded_loss = model(**pad_batch(rows, 0), use_cache=False).loss
    packed_loss = model(**packed, use_cache=False).loss
    assert float(packed_loss) == pytest.approx(float(padded_loss), abs=1e-6)
