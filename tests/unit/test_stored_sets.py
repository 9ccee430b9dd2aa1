"""DPO's pairs, KTO's examples, RL's prompts and the prompts a round draws, read from data prep's stored
splits as views: the same sequences as the rows encoded in memory, each row read only when a batch needs it,
and every length check made from the stored ids' lengths."""

from __future__ import annotations

import functools
import string

import datasets
import numpy as np
import pytest
import torch

from configs.errors import DataError
from configs.schema import DPOConfig
from stages.data import prepared as prepared_data
from stages.data_prep import stage as data_prep
from stages.data_prep import tiny_model
from stages.dpo import pairs as stored
from stages.dpo import stage as dpo
from stages.rl import stage as rl_stage

EOS = tiny_model.EOS


@pytest.fixture(scope="module")
def tok():
    return tiny_model.train_tokenizer([string.printable, "User: Assistant: question answer"], 96)


def saved(tmp_path, name: str, rows: list[dict], tok=None, fields: tuple[str, ...] = ()) -> datasets.Dataset:
    """`rows` as split `train` of dataset `name`: through data prep's row preparer when `fields` are given
    (their ids stored), else as they are; read back memory-mapped."""
    ds = datasets.Dataset.from_list(rows)
    if fields:
        preparer = data_prep.RowPreparer(tok, fields, (), 64, True, functools.partial(data_prep.row_number, f"{name}/train"))
        ds, _ = data_prep.prepare(f"{name}/train", ds, preparer, 1, None)
    prepared_data.save(ds, tmp_path / name, "train")
    return prepared_data.load(tmp_path / name, "train")


class Counted:
    """A row maker that counts the rows it was given."""

    def __init__(self, make):
        self.make, self.reads = make, 0

    def __call__(self, row: dict):
        self.reads += 1
        return self.make(row)


def test_stored_pairs_are_the_pairs_encoded_in_memory_with_their_shape_read_from_the_lengths(tok, tmp_path):
    rows = [{"prompt": f"q{i} " * (i + 1), "chosen": f"good {i}{EOS}", "rejected": f"bad{EOS}"} for i in range(6)]
    pairs, shape = stored.stored_pairs(saved(tmp_path, "pref_data", rows, tok, ("prompt", "chosen", "rejected")), "pref")
    expected = dpo.encode_pairs(tok, rows)  # no stored ids in these rows: tokenized now, field by field
    assert list(pairs) == expected and len(pairs) == 6
    n_tokens = [len(tok(r["prompt"] + r["chosen"], add_special_tokens=False)["input_ids"]) for r in rows]
    assert shape == stored.PairShape(True, max(n_tokens)) == stored.PairShape.of(expected)


def test_a_pair_with_an_empty_response_cannot_share_its_prompt(tmp_path):
    rows = [{"prompt_ids": [1, 2], "chosen_ids": [3], "rejected_ids": [4, 5, 6]},
            {"prompt_ids": [1], "chosen_ids": [3], "rejected_ids": []}]
    pairs, shape = stored.stored_pairs(saved(tmp_path, "pref_data", rows), "pref")
    assert shape == stored.PairShape(False, 5) == stored.PairShape.of(list(pairs))
    assert not dpo.PairObjective(DPOConfig(), pairs, 0, shared_prompt=True, shape=shape).shared_prompt
    _, whole = stored.stored_pairs(saved(tmp_path, "pref_data", rows[:1]), "pref")
    objective = dpo.PairObjective(DPOConfig(), pairs[:1], 0, shared_prompt=True, window=5, shape=whole)
    assert objective.shared_prompt
    assert not dpo.PairObjective(DPOConfig(), pairs[:1], 0, shared_prompt=True, window=4, shape=whole).shared_prompt


def test_the_objectives_read_no_row_until_a_batch_asks_for_it(tmp_path):
    rows = [{"prompt_ids": [i % 3 + 1], "chosen_ids": [10 + i], "rejected_ids": [20 + i]} for i in range(8)]
    ds = saved(tmp_path, "pref_data", rows)
    _, shape = stored.stored_pairs(ds, "pref")
    counted = Counted(stored.pair_of)
    pairs = prepared_data.MappedRows(ds, (stored.PROMPT, stored.CHOSEN, stored.REJECTED), counted)
    made = [dpo.PairObjective(DPOConfig(), pairs, 0, shared_prompt=True, shape=shape),
            dpo.KTOObjective(DPOConfig(loss="kto"), pairs, 0, world=1)]
    assert counted.reads == 0
    assert [(o.n_rows, len(o.sequences)) for o in made] == [(8, 16), (16, 32)]  # KTO: two examples a pair, each with its KL
    pair = dpo.PairObjective(DPOConfig(), pairs, 0)
    batch = pair.collate(torch.arange(16, dtype=torch.float32), [5])
    assert counted.reads == 2  # pair 5, once for its chosen and once for its rejected sequence
    assert batch["input_ids"].tolist() == [[3, 15], [3, 25]]


def test_kto_pairs_and_examples_give_the_kl_sequences_of_the_next_other_prompt():
    """By hand: example j's KL sequence is its prompt with the response of the first example from j + start
    on (cyclically) that has another prompt; split pairs start at j + 2, unpaired examples at j + 1."""
    pairs = [(([1], [5]), ([1], [6])), (([2], [7]), ([2], [8]))]
    split = dpo.KTOObjective(DPOConfig(loss="kto"), pairs, 0, world=1)
    assert list(split.sequences) == [([1], [5]), ([1], [6]), ([2], [7]), ([2], [8]),
                                     ([1], [7]), ([1], [8]), ([2], [5]), ([2], [6])]
    assert [bool(d) for d in split.desirable] == [True, False, True, False]
    examples = [([1], [10]), ([1], [11]), ([2], [12]), ([3], [13])]
    unpaired = dpo.KTOObjective(DPOConfig(loss="kto"), [], 0, 1, (examples, [True, False, False, True]))
    assert list(unpaired.sequences) == [*examples, ([1], [12]), ([1], [12]), ([2], [13]), ([3], [10])]
    assert unpaired.sequences[-1] == ([3], [10]) and unpaired.sequences[2:4] == examples[2:4]


def test_stored_examples_are_the_unpaired_rows_with_their_desirability(tok, tmp_path):
    rows = [{"prompt": f"q{i % 2} ", "response": f"r{i}{EOS}", "desirable": i % 3 == 0} for i in range(5)]
    examples, desirable = stored.stored_examples(saved(tmp_path, "pref_data", rows, tok, ("prompt", "response")), "pref")
    assert list(examples) == dpo.encode_examples(tok, rows)[0]
    assert desirable.dtype == np.bool_ and desirable.tolist() == [True, False, False, True, False]


def test_stored_prompts_are_the_prompts_encoded_in_memory(tok, tmp_path):
    rows = [{"prompt": f"question {i}", "label": str(i)} for i in range(5)]
    saved(tmp_path, "prompts", rows, tok, ("prompt",))
    prompts = rl_stage.stored_prompts(tmp_path / "prompts", "train", 64, "prompts/train")
    assert list(prompts) == rl_stage.encode_prompts(tok, rows, 64, "prompts/train")
    assert len(rl_stage.stored_prompts(tmp_path / "prompts", "train", 64, "prompts/train", limit=2)) == 2
    saved(tmp_path, "unlabeled", [{"prompt": "q", "prompt_ids": [4, 5]}])
    assert list(rl_stage.stored_prompts(tmp_path / "unlabeled", "train", 64, "u")) == [rl_stage.Prompt("q", [4, 5], None)]


@pytest.mark.parametrize(("lengths", "limit", "error"), [
    ([2, 9, 0, 9], None, "p row 1: prompt is 9 tokens, over rl.rollout.prompt_max_len=8"),
    ([2, 3, 0, 9], None, "p row 2: empty prompt"),
    ([2, 3, 0, 9], 2, None),  # the rows past the limit are not read, nor checked
])
def test_the_first_unfit_stored_prompt_is_named_by_its_row(tmp_path, lengths, limit, error):
    saved(tmp_path, "prompts", [{"prompt": "x" * n, "prompt_ids": list(range(n))} for n in lengths])
    if error is None:
        assert len(rl_stage.stored_prompts(tmp_path / "prompts", "train", 8, "p", limit)) == limit
        return
    with pytest.raises(DataError, match=f"^{error}$"):
        rl_stage.stored_prompts(tmp_path / "prompts", "train", 8, "p", limit)
    rows = [{"prompt": "x" * n, "prompt_ids": list(range(n))} for n in lengths]
    with pytest.raises(DataError, match=f"^{error}$"):  # rows held in memory: the same line
        rl_stage.encode_prompts(None, rows, 8, "p")


def test_a_row_view_reads_a_row_when_indexed(tok, tmp_path):
    rows = [{"prompt": f"q{i}", "label": str(i)} for i in range(4)]
    saved(tmp_path, "prompts", rows, tok, ("prompt",))
    view = prepared_data.row_view(tmp_path / "prompts", "train")
    assert len(view) == 4 and view[2] == rows[2] and view[-1] == rows[3] and list(view) == rows


def test_a_slice_of_a_view_is_its_rows_read_at_once(tok, tmp_path):
    rows = [{"prompt": f"q{i}", "label": str(i)} for i in range(7)]
    saved(tmp_path, "prompts", rows, tok, ("prompt",))
    view = prepared_data.row_view(tmp_path / "prompts", "train")
    assert view[2:5] == rows[2:5] and view[:] == rows and view[5:] == rows[5:] and view[4:2] == []
    assert view[::3] == rows[::3] and view[-2:] == rows[-2:]
