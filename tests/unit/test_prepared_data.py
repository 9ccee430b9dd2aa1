"""Data prep's Arrow splits: the digest of their content, the rows made by one process or several, the
(ids, labels) rows SFT reads from them, and the character check that keeps an over-long row from the tokenizer."""

from __future__ import annotations

import functools
import json
import string

import datasets
import pytest

from configs.errors import DataError
from configs.schema import PipelineConfig
from stages.data import prepared as prepared_data
from stages.data_prep import stage as data_prep
from stages.data_prep import tiny_model
from tests.prepared_rows import file_rows

EOS = tiny_model.EOS


@pytest.fixture(scope="module")
def tok():
    return tiny_model.train_tokenizer([string.printable, "User: Assistant: question answer"], 96)


def sft_rows(n: int) -> list[dict]:
    return [{"texts": [f"q{i} ", f"a{i}{EOS}"], "train": [False, True]} for i in range(n)]


def prepared(tok, rows: list[dict], procs: int, tmp_path=None) -> datasets.Dataset:
    preparer = data_prep.RowPreparer(tok, ("texts",), (), 64, True, functools.partial(data_prep.row_number, "sft_data/train"))
    ds, dropped = data_prep.prepare("sft_data/train", datasets.Dataset.from_list(rows), preparer, procs, tmp_path)
    assert dropped == 0
    return ds


def test_the_digest_is_of_the_rows_not_of_how_they_are_chunked():
    rows = [{"prompt": f"p{i}", "ids": list(range(i % 7))} for i in range(50)]
    whole = datasets.Dataset.from_list(rows)
    pieces = datasets.concatenate_datasets([datasets.Dataset.from_list(rows[:13]), datasets.Dataset.from_list(rows[13:])])
    assert len(whole.data.column(0).chunks) == 1 and len(pieces.data.column(0).chunks) == 2  # two layouts, the same rows
    assert prepared_data.content_digest(whole) == prepared_data.content_digest(pieces)
    other = datasets.Dataset.from_list([*rows[:49], {"prompt": "p49", "ids": [0]}])
    assert prepared_data.content_digest(other) != prepared_data.content_digest(whole)


def test_two_processes_make_the_rows_of_one_in_the_same_order(tok, tmp_path):
    rows = sft_rows(40)
    one, two = prepared(tok, rows, 1), prepared(tok, rows, 2, tmp_path)
    assert one.to_list() == two.to_list()
    assert [r["texts"] for r in prepared_data.rows(two)] == [r["texts"] for r in rows]
    assert prepared_data.content_digest(one) == prepared_data.content_digest(two)


def test_a_saved_split_reads_back_as_rows_token_rows_and_a_manifest(tok, tmp_path):
    ds = prepared(tok, sft_rows(5), 1)
    folder = tmp_path / "sft_data"
    entry = prepared_data.save(ds, folder, "train")
    prepared_data.write_manifest(folder, {"train": entry})
    assert prepared_data.manifest(folder) == {"train": {"rows": 5, "sha256": prepared_data.content_digest(ds),
                                                        "first": sft_rows(1)[0]}}
    assert prepared_data.read_split(folder, "train") == sft_rows(5)  # the rendered rows, no token columns
    rows = prepared_data.token_rows(folder, "train")
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in ("q3 ", f"a3{EOS}")]
    assert len(rows) == 5 and rows[3] == (ids[0] + ids[1], [-100] * len(ids[0]) + ids[1])
    assert rows[-2] == rows[3] and rows[3:5] == [rows[3], rows[4]] and rows[::2] == [rows[0], rows[2], rows[4]]
    assert list(rows) == [rows[i] for i in range(5)]
    with pytest.raises(IndexError):
        rows[5]
    with pytest.raises(DataError, match=r"^.*/sft_data/eval: missing \(expected a dataset split written by data prep\)$"):
        prepared_data.token_rows(folder, "eval")


def test_a_split_without_token_columns_is_a_one_line_error(tmp_path):
    datasets.Dataset.from_list([{"prompt": "p"}]).save_to_disk(str(tmp_path / "sft_data" / "train"))
    with pytest.raises(DataError, match=r"^an SFT split without input_ids, loss_mask: written by an older data prep; rerun data_prep$"):
        prepared_data.token_rows(tmp_path / "sft_data", "train")


class CountingTokenizer:
    """The tokenizer, recording the longest text it was given."""

    def __init__(self, tok):
        self.tok, self.longest = tok, 0

    def __call__(self, texts, **kwargs):
        self.longest = max([self.longest, *(len(t) for t in (texts if isinstance(texts, list) else [texts]))])
        return self.tok(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_row_that_cannot_fit_is_dropped_by_its_characters_before_it_is_tokenized(tok, tmp_path):
    huge = "x" * 2_000_000
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps(r) + "\n" for r in [{"input": f"q{i}", "output": f"a{i}"} for i in range(6)]
                           + [{"input": "q", "output": huge}]))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input": "q", "label": "1"}) + "\n" + json.dumps({"input": "r", "label": "2"}) + "\n")
    model = tmp_path / "model"
    tiny_model.build_model(PipelineConfig().model.tiny, tok, 0).save_pretrained(model)
    tok.save_pretrained(model)
    data = {"source": "files", "max_len": 64, "sft": {"paths": [str(sft)], "eval_ratio": 0.3, "apply_chat_template": False},
            "prompts": {"paths": [str(prompts)], "eval_ratio": 0.5}}
    cfg = PipelineConfig.model_validate({"model": {"name_or_path": str(model)}, "data": data})
    counting, dropped = CountingTokenizer(tok), {}
    out = file_rows(cfg, counting, dropped)
    assert dropped["sft_data/train"] + dropped["sft_data/eval"] == 1
    assert len(out["sft_data"]["train"]) + len(out["sft_data"]["eval"]) == 6
    assert counting.longest < 1000  # the 2,000,000 characters never reached the tokenizer
    limit = data_prep.char_limit(tok, 64)
    strict = cfg.model_copy(update={"data": cfg.data.model_copy(update={"strict_lengths": True})})
    with pytest.raises(DataError, match=rf"^{sft} line 7: over {limit} characters, more than data.max_len tokens can hold "
                                        r"\(data.strict_lengths\)$"):
        file_rows(strict, tok)


def test_stored_ids_are_what_tokenizing_each_field_apart_gives(tok, tmp_path):
    """The ids RM, PRM, DPO and RL read instead of tokenizing: equal to the tokenizer's on each field alone."""
    pairs = [{"prompt": f"q{i} ", "chosen": f"good {i}{EOS}", "rejected": f"bad{EOS}", "margin": 0.5 * i} for i in range(4)]
    fields = ("prompt", "chosen", "rejected")
    preparer = data_prep.RowPreparer(tok, fields, (), 64, True, functools.partial(data_prep.row_number, "pref_data/train"))
    ds, _ = data_prep.prepare("pref_data/train", datasets.Dataset.from_list(pairs), preparer, 1, None)
    prepared_data.save(ds, tmp_path / "pref_data", "train")
    stored = prepared_data.load(tmp_path / "pref_data", "train").select_columns(["margin", *map(prepared_data.ids_column, fields)]).to_list()
    assert stored == [{"margin": r["margin"], **{f"{f}_ids": tok(r[f], add_special_tokens=False)["input_ids"] for f in fields}}
                      for r in pairs]
    assert prepared_data.read_split(tmp_path / "pref_data", "train") == pairs
    assert [prepared_data.field_ids(tok, row, "chosen") for row in stored] == \
        [prepared_data.field_ids(tok, row, "chosen") for row in pairs]  # stored, or tokenized now: the same
