"""Data prep on real files: loading through HF `datasets`, column checks, splits, mixing, rendering,
row validation, and the stage's `preflight`/`run` on `data.source: files`.

Everything is local and tiny: a BPE tokenizer trained on a few lines and a 1-layer Llama checkpoint.
"""

from __future__ import annotations

import functools
import json
import string
from pathlib import Path

import datasets
import pytest

from configs.errors import DataError
from configs.schema import DatasetConfig, PipelineConfig, TinyModelConfig
from stages.common import checkpoint, checkpoint_paths
from stages.dag import preflight
from stages.dag.contract import StageContext
from stages.data import files as data_files
from stages.data import prepared as prepared_data
from stages.data.tokenization import IGNORE_INDEX, encode_segments
from stages.data_prep import stage as data_prep
from stages.data_prep import tiny_model
from tests.prepared_rows import file_rows

EOS = tiny_model.EOS


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _isolated_datasets_cache(tmp_path_factory):
    """Keep HF `datasets` caches out of the home directory and its progress bars out of the log."""
    old_cache = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = tmp_path_factory.mktemp("hf_datasets_cache")
    datasets.disable_progress_bars()
    yield
    datasets.enable_progress_bars()
    datasets.config.HF_DATASETS_CACHE = old_cache


@pytest.fixture(scope="module")
def tok():
    # every printable character is in the corpus, so decoding is lossless for the texts used here
    corpus = [string.printable, "some corpus text 123", "User: Assistant: question answer hello world"]
    return tiny_model.train_tokenizer(corpus, 96)


@pytest.fixture(scope="module")
def model_dir(tok, tmp_path_factory):
    cfg = TinyModelConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2
    )
    model = tiny_model.build_model(cfg, tok, seed=0)
    return checkpoint.save(model, tok, tmp_path_factory.mktemp("ckpt") / "model")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def qa_rows(n: int, tag: str = "q") -> list[dict]:
    return [{"input": f"{tag}{i}", "output": f"a{i}"} for i in range(n)]


def load(paths, seed: int = 0, section: str = "sft", columns=None, **kw):
    cfg = DatasetConfig(paths=[str(p) for p in paths], **kw)
    columns = columns or {"input_key": cfg.input_key, "output_key": cfg.output_key}
    return data_files.load_mixed(cfg, section, columns, seed)


def files_config(model_dir: Path, sft: dict, prompts: dict, **data) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "seed": 0,
            "model": {"name_or_path": str(model_dir)},
            "data": {"source": "files", "sft": sft, "prompts": prompts, **data},
        }
    )


def run_stage(cfg: PipelineConfig, tmp_path: Path):
    ctx = StageContext(stage="data_prep", config=cfg, output_dir=tmp_path / "out", work_dir=tmp_path / "work")
    return data_prep.run(ctx, {})


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- loading -------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet", ".csv"])
def test_load_source_reads_each_file_format(tmp_path, suffix):
    rows = qa_rows(3)
    path = tmp_path / f"data{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".jsonl":
        write_jsonl(path, rows)
    elif suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        path.write_text("input,output\n" + "".join(f"{r['input']},{r['output']}\n" for r in rows))
    ds = data_files.load_source(str(path), "train")
    assert ds.column_names == ["input", "output"]
    assert ds.to_list() == rows


def test_load_source_json_folder_reads_every_json_file_in_name_order(tmp_path):
    folder = tmp_path / "folder"
    write_jsonl(folder / "b.jsonl", qa_rows(2, "b"))
    (folder / "a.json").write_text(json.dumps(qa_rows(1, "a")))
    (folder / "notes.txt").write_text("not data")
    ds = data_files.load_source(f"json@{folder}", "train")
    assert list(ds["input"]) == ["a0", "b0", "b1"]


def test_json_folder_without_json_files_is_a_data_error(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match=r"json@.*: no \.json/\.jsonl files in"):
        data_files.load_source(f"json@{tmp_path}", "train")
    with pytest.raises(DataError, match=r"no .json/.jsonl files"):
        data_files.load_source(f"json@{tmp_path / 'missing'}", "train")


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(DataError) as err:
        load([path])
    assert str(err.value) == f"{path}: no such file"


def test_missing_column_names_column_and_config_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"input": "q", "answer": "a"}])
    with pytest.raises(DataError) as err:
        load([path])
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == (f"{path}: missing column 'output' (set by data.sft.output_key); columns are: input, answer; "
                   "set data.sft.output_key to the one that holds it")


def test_renamed_keys_are_read(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a", "extra": 1}])
    train, ev = load([path], columns={"input_key": "question", "output_key": "answer"}, eval_ratio=0.0)
    # only the needed columns are kept, and where each row came from
    assert train.to_list() == [{"question": "q", "answer": "a", "__source__": 0, "__row__": 0}]
    assert len(ev) == 0


@pytest.mark.parametrize(("name", "text"), [("e.jsonl", ""), ("blank.jsonl", "  \n\n"), ("e.csv", ""), ("e.parquet", "")])
def test_empty_file_is_a_data_error_naming_the_paths_key(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError) as err:
        load([path])
    assert str(err.value) == f"{path}: file is empty; add rows or remove it from data.sft.paths"


@pytest.mark.parametrize(("name", "text"), [("a.json", "[]"), ("h.csv", "input,output\n")])
def test_a_file_without_rows_is_a_data_error(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError) as err:
        load([path], section="preference")
    assert str(err.value) == f"{path}: no rows; add rows or remove it from data.preference.paths"


def test_sources_with_columns_but_no_rows_are_data_errors(tmp_path):
    path = tmp_path / "empty.parquet"
    datasets.Dataset.from_dict({"input": [], "output": []}).to_parquet(str(path))
    with pytest.raises(DataError) as err:  # HF `datasets` itself refuses a file without rows
        load([path])
    assert str(err.value) == f"{path}: no rows; add rows or remove it from data.sft.paths"
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"input": [], "output": []}).save_to_disk(str(saved))
    with pytest.raises(DataError) as err:
        load([saved])
    assert str(err.value).startswith(f"{saved}: cannot load dataset saved with save_to_disk (")


def test_unreadable_file_is_a_one_line_data_error(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_text("not parquet")
    with pytest.raises(DataError) as err:
        load([path])
    assert str(err.value).startswith(f"{path}: cannot load dataset (")
    assert "\n" not in str(err.value)


def test_max_samples_keeps_the_first_rows(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", qa_rows(10))
    train, ev = load([path], max_samples=4, eval_ratio=0.0)
    assert list(train["input"]) == ["q0", "q1", "q2", "q3"]
    assert len(ev) == 0
    train, _ = load([path], max_samples=50, eval_ratio=0.0)  # more than there are: all rows
    assert len(train) == 10


def test_eval_ratio_split_sizes_disjoint_and_seeded(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", qa_rows(20))
    train, ev = load([path], eval_ratio=0.25, seed=3)
    assert (len(train), len(ev)) == (15, 5)
    assert sorted(list(train["input"]) + list(ev["input"])) == sorted(f"q{i}" for i in range(20))
    again_train, again_ev = load([path], eval_ratio=0.25, seed=3)
    assert list(again_train["input"]) == list(train["input"]) and list(again_ev["input"]) == list(ev["input"])
    # max_samples applies before the split
    train, ev = load([path], eval_ratio=0.25, max_samples=8)
    assert (len(train), len(ev)) == (6, 2)
    assert set(train["input"]) | set(ev["input"]) == {f"q{i}" for i in range(8)}


def test_eval_split_from_a_folder_of_split_files(tmp_path):
    folder = tmp_path / "ds"
    write_jsonl(folder / "train.jsonl", qa_rows(5))
    write_jsonl(folder / "test.jsonl", qa_rows(2, "t"))
    train, ev = load([folder], eval_split="test", eval_ratio=0.25)  # eval_split wins over eval_ratio
    assert list(train["input"]) == ["q0", "q1", "q2", "q3", "q4"]
    assert list(ev["input"]) == ["t0", "t1"]
    with pytest.raises(DataError) as err:
        load([folder], eval_split="validation")
    assert str(err.value) == f"{folder}: no split 'validation'; splits are: train, test"


def test_eval_split_from_a_saved_dataset_dict(tmp_path):
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        train=datasets.Dataset.from_list([{"input": "x", "output": "y", "extra": 1}] * 3),
        test=datasets.Dataset.from_list([{"input": "u", "output": "v"}]),
    ).save_to_disk(str(saved))
    train, ev = load([saved], eval_split="test")
    assert train.remove_columns(list(data_files.ORIGIN_COLUMNS)).to_list() == [{"input": "x", "output": "y"}] * 3
    assert ev.to_list() == [{"input": "u", "output": "v", "__source__": 1, "__row__": 0}]  # source 1: the eval split
    assert data_files.locate(DatasetConfig(paths=[str(saved)], eval_split="test"), ev[0]) == f"{saved} (split 'test') row 1"
    with pytest.raises(DataError, match=r"no split 'validation'; splits are: train, test"):
        load([saved], eval_split="validation")


def test_eval_split_missing_a_column_names_split_and_field(tmp_path):
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        train=datasets.Dataset.from_list([{"input": "x", "output": "y"}]),
        test=datasets.Dataset.from_list([{"input": "u"}]),
    ).save_to_disk(str(saved))
    with pytest.raises(DataError, match=r"\(split 'test'\): missing column 'output' \(set by data\.sft\.output_key\)"):
        load([saved], eval_split="test")


def test_eval_split_on_a_single_file_is_an_error_not_the_train_rows(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", qa_rows(4))
    with pytest.raises(DataError) as err:
        load([path], eval_split="test")
    assert str(err.value) == (f"{path}: a single file is one split, 'train', not 'test'; "
                              "use eval_ratio instead of eval_split, or a folder with a test file")


def test_two_sources_mixed_with_probs_use_every_row_and_are_seeded(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", qa_rows(3, "a"))
    b = write_jsonl(tmp_path / "b.jsonl", qa_rows(6, "b"))
    train, ev = load([a, b], probs=[3.0, 1.0], eval_ratio=0.0, seed=7)
    inputs = list(train["input"])
    # all_exhausted: sampling goes on until every source has been used up at least once
    assert {f"a{i}" for i in range(3)} | {f"b{i}" for i in range(6)} <= set(inputs)
    assert set(inputs) <= {f"a{i}" for i in range(3)} | {f"b{i}" for i in range(6)}
    assert len(inputs) >= 9
    assert len(ev) == 0
    again, _ = load([a, b], probs=[3.0, 1.0], eval_ratio=0.0, seed=7)
    assert list(again["input"]) == inputs


def test_two_sources_without_probs_are_concatenated_in_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", qa_rows(2, "a"))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(qa_rows(4, "b")))
    train, ev = load([a, b], eval_ratio=0.25)
    assert (len(train), len(ev)) == (1 + 3, 1 + 1)
    assert [x[0] for x in train["input"]] == ["a", "b", "b", "b"]


def test_sources_with_clashing_column_types_are_a_data_error(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"input": "q", "label": "1"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"input": "q", "label": 2}])
    with pytest.raises(DataError, match=r"^data\.prompts: cannot mix .*a\.jsonl, .*b\.jsonl \("):
        load([a, b], section="prompts", columns={"input_key": "input", "label_key": "label"}, eval_ratio=0.0)


# --- bad input: one line naming the file, the line or row in it, the key and what to do ----------


def load_section(path: Path, section: str, **kw):
    cfg = DatasetConfig(paths=[str(path)], eval_ratio=0.0, **kw)
    return data_files.load_mixed(cfg, section, data_files.file_columns(section, cfg), seed=0)


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    ("section", "kw", "lines", "message"),
    [
        ("sft", {}, ['{"input": "q", "output": "a"}', '{"input": 42, "output": "a"}'],
         "line 2: 'input' (data.sft.input_key) must be a string or a list of {role, content} messages, not the number 42"),
        # every value a number: HF `datasets` makes the column int64, still not text
        ("sft", {}, ['{"input": "q", "output": 1}', '{"input": "r", "output": 2}'],
         "line 1: 'output' (data.sft.output_key) must be a string, not the number 1"),
        ("preference", {}, ['{"chosen": "good", "rejected": "bad"}', '{"chosen": 3, "rejected": "bad"}'],
         "line 2: 'chosen' (data.preference.chosen_key) must be a string, or a list of {role, content} messages "
         "ending with the assistant's reply, not the number 3"),
        ("preference", {"margin_key": "m"}, ['{"chosen": "good", "rejected": "bad", "m": "high"}'],
         "line 1: 'm' (data.preference.margin_key) must be a number, not the string 'high'"),
        ("preference", {"input_key": "prompt"}, ['{"prompt": {"text": "q"}, "chosen": "good", "rejected": "bad"}'],
         "line 1: 'prompt' (data.preference.input_key) must be a string or a list of {role, content} messages, not an object"),
        ("prompts", {}, ['{"input": "q", "label": true}'],
         "line 1: 'label' (data.prompts.label_key) must be a string, a number, or a list of {role, content} messages (the "
         "last one's content is the label), not the boolean true"),
    ],
)
def test_a_value_of_the_wrong_type_names_file_line_key_and_type(tmp_path, section, kw, lines, message):
    path = write_lines(tmp_path / "d.jsonl", *lines)
    with pytest.raises(DataError) as err:
        load_section(path, section, **kw)
    assert str(err.value) == f"{path} {message}"


def test_csv_values_are_read_as_written(tmp_path):
    """CSV has no types: a number-like answer is text, and a label keeps its digits."""
    path = tmp_path / "d.csv"
    path.write_text('input,output,label\nq,42,1.50\n"two\nlines",7,007\n')
    train, _ = load_section(path, "prompts")
    assert list(train["label"]) == ["1.50", "007"]
    train, _ = load_section(path, "sft")
    assert list(train["output"]) == ["42", "7"]


def test_a_csv_row_with_extra_fields_names_the_file_and_line(tmp_path, capfd):
    path = tmp_path / "d.csv"
    path.write_text("input,output\nq,a\nr,b,c\n")
    with pytest.raises(DataError) as err:
        load([path])
    assert str(err.value) == f"{path}: cannot load dataset (Error tokenizing data. C error: Expected 2 fields in line 3, saw 3)"
    assert "Failed to" not in capfd.readouterr().err


def test_bytes_that_are_not_utf8_name_file_line_and_offset(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes('{"input": "q", "output": "a"}\n\n{"input": "caf\xe9", "output": "a"}\n'.encode("latin-1"))
    with pytest.raises(DataError) as err:
        load([path])
    assert str(err.value) == (f"{path} line 3: byte 0xe9 at offset 45 is not UTF-8 text; "
                              "re-encode the file as UTF-8 (e.g. iconv -f <its encoding> -t UTF-8)")
    path = tmp_path / "d.csv"
    path.write_bytes("input,output\ncaf\xe9,a\n".encode("latin-1"))
    with pytest.raises(DataError, match=rf"^{path} line 2: byte 0xe9 at offset 16 is not UTF-8 text; re-encode"):
        load([path])


def test_parquet_text_that_is_not_utf8_names_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"  # parquet checks nothing: bytes declared as text are stored as they are
    text = pa.array([b"q", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"input": text, "output": ["a", "b"]}), path)
    with pytest.raises(DataError) as err:
        load([path])
    assert str(err.value) == f"{path} row 2: text that is not UTF-8; re-encode the data as UTF-8"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("d.jsonl", '{"input": "q", "output": "a"}\n\n{"input": "r" "output": "a"}\n',
         "line 3: not valid JSON (Expecting ',' delimiter at column 15); fix or remove that line"),
        ("d.jsonl", '{"input": "q", "output": "a"}\n"just text"\n',
         "line 2: the string 'just text', not a JSON object; each line must be one object of named fields"),
        ("d.json", '[\n  {"input": "q", "output": "a"},\n  {"input": "r", "output": "a"\n]\n',
         "line 4: not valid JSON (Expecting ',' delimiter at column 1); fix the JSON there"),
        ("d.json", '{"input": "q",\n "output" "a"}\n',
         "line 2: not valid JSON (Expecting ':' delimiter at column 11); fix the JSON there"),
    ],
)
def test_malformed_json_names_the_line(tmp_path, capfd, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError) as err:
        load([path])
    assert str(err.value) == f"{path} {message}"
    assert "Failed to" not in capfd.readouterr().err  # HF `datasets` logs the parse error it raises: not on the terminal


def test_conversations_without_the_assistant_turn_they_need(tmp_path):
    user, reply = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
    path = write_jsonl(tmp_path / "sft.jsonl", [{"messages": [user, reply]}, {"messages": [user]}])
    with pytest.raises(DataError) as err:
        load_section(path, "sft", input_key="messages", multiturn=True)
    assert str(err.value) == (f"{path} line 2: 'messages' (data.sft.input_key) has no assistant turn, so nothing "
                              "to train on; add the assistant's reply or remove the row")

    write_jsonl(path, [{"messages": [user, "hello"]}])
    with pytest.raises(DataError, match=r"line 1: 'messages' \(data\.sft\.input_key\) message 2 must be "):
        load_section(path, "sft", input_key="messages", multiturn=True)

    pref = write_jsonl(tmp_path / "pref.jsonl", [{"chosen": [user, reply], "rejected": [user]}])
    with pytest.raises(DataError) as err:
        load_section(pref, "preference")
    assert str(err.value) == (f"{pref} line 1: 'rejected' (data.preference.rejected_key) must end with the "
                              "assistant's reply (the response), not a 'user' turn")


def test_where_names_the_line_or_row_in_the_file_the_user_wrote(tmp_path):
    jsonl = write_lines(tmp_path / "a.jsonl", '{"input": "a0"}', "", "  ", '{"input": "a1"}')
    assert data_files.where(str(jsonl), "train", None, 1) == f"{jsonl} line 4"  # blank lines hold no row
    table = tmp_path / "b.csv"
    table.write_text('input,output\na,"one\ntwo"\n\nb,x\n')
    assert [data_files.where(str(table), "train", None, i) for i in (0, 1)] == [f"{table} line 2", f"{table} line 5"]
    array = tmp_path / "c.json"
    array.write_text(json.dumps(qa_rows(3), indent=2))
    assert data_files.where(str(array), "train", None, 2) == f"{array} row 3"
    parquet = tmp_path / "d.parquet"
    datasets.Dataset.from_list(qa_rows(2)).to_parquet(str(parquet))
    assert data_files.where(str(parquet), "train", None, 1) == f"{parquet} row 2"
    folder = tmp_path / "folder"
    write_jsonl(folder / "x.jsonl", qa_rows(2))
    write_jsonl(folder / "y.jsonl", qa_rows(2))
    assert data_files.where(f"json@{folder}", "train", None, 3) == f"{folder / 'y.jsonl'} line 2"
    splits = tmp_path / "splits"
    write_jsonl(splits / "train.jsonl", qa_rows(2))
    write_jsonl(splits / "test.jsonl", qa_rows(2))
    assert data_files.where(str(splits), "test", None, 1) == f"{splits / 'test.jsonl'} line 2"
    assert data_files.where("org/dataset", "train", None, 4) == "org/dataset (split 'train') row 5"


def test_every_row_keeps_its_file_and_line_through_split_and_mix(tmp_path):
    a = write_lines(tmp_path / "a.jsonl", *[json.dumps({"input": f"a{i}", "output": "x"}) + "\n" for i in range(5)])
    b = tmp_path / "b.csv"
    b.write_text("input,output\n" + "".join(f'b{i},"x\ny"\n' for i in range(4)))  # each row spans two lines
    cfg = DatasetConfig(paths=[str(a), str(b)], probs=[1.0, 2.0], eval_ratio=0.3)
    train, ev = data_files.load_mixed(cfg, "sft", data_files.file_columns("sft", cfg), seed=5)
    expected = {f"a{i}": f"{a} line {2 * i + 1}" for i in range(5)} | {f"b{i}": f"{b} line {2 * i + 2}" for i in range(4)}
    rows = train.to_list() + ev.to_list()
    assert len(ev) > 0 and {r["input"] for r in rows} == set(expected)
    assert all(data_files.locate(cfg, r) == expected[r["input"]] for r in rows)


def test_an_error_found_after_the_shuffle_names_the_source_line(tok, model_dir, tmp_path):
    sft = write_jsonl(tmp_path / "sft.jsonl", qa_rows(4))
    prompts = tmp_path / "p.csv"
    rows = [f"q{i},#### {i}" for i in range(9)]
    rows[6] = "q6,no answer here"
    prompts.write_text("input,label\n" + "\n\n".join(rows) + "\n")  # a blank line between rows
    pattern = r"####\s*(\d+)"
    cfg = files_config(model_dir, _sft_cfg(sft), {"paths": [str(prompts)], "eval_ratio": 0.3, "label_pattern": pattern})
    with pytest.raises(DataError) as err:
        file_rows(cfg, tok)
    assert str(err.value) == f"{prompts} line 14: 'label' 'no answer here' has no match for data.prompts.label_pattern {pattern!r}"


def test_preference_pairs_mixing_text_and_conversation_are_named(tok, model_dir, tmp_path):
    sft = write_jsonl(tmp_path / "sft.jsonl", qa_rows(2))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 2)
    user, reply = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
    pref = write_jsonl(tmp_path / "pref.jsonl", [{"chosen": "a", "rejected": "b"}, {"chosen": [user, reply], "rejected": "b"}])
    cfg = files_config(model_dir, _sft_cfg(sft), {"paths": [str(prompts)], "eval_ratio": 0.5},
                       preference={"paths": [str(pref)], "eval_ratio": 0.5})
    with pytest.raises(DataError) as err:
        file_rows(cfg, tok)
    assert str(err.value) == f"{pref} line 2: 'chosen' and 'rejected' must both be text or both be conversations"


# --- rendering -----------------------------------------------------------------------------------


def test_render_prompt_chat_template_and_input_template(tok):
    assert data_prep.render_prompt(tok, "hi", None) == "<|user|>\nhi\n<|assistant|>\n"
    chat = DatasetConfig(paths=["x.jsonl"])
    assert data_prep.render_prompt(tok, "hi", chat) == "<|user|>\nhi\n<|assistant|>\n"
    templ = DatasetConfig(paths=["x.jsonl"], apply_chat_template=False, input_template="User: {}\nAssistant: ")
    assert data_prep.render_prompt(tok, "hi", templ) == "User: hi\nAssistant: "
    assert data_prep.render_prompt(tok, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], templ) == (
        "User: a\nb\nAssistant: "
    )
    plain = DatasetConfig(paths=["x.jsonl"], apply_chat_template=False)
    assert data_prep.render_prompt(tok, "hi", plain) == "hi"


def test_sft_row_with_input_template(tok):
    cfg = DatasetConfig(paths=["x.jsonl"], apply_chat_template=False, input_template="User: {}\nAssistant: ")
    row = data_prep.sft_row(tok, "question", "answer", cfg)
    assert row == {"texts": ["User: question\nAssistant: ", "answer" + EOS], "train": [False, True]}


def test_sft_row_with_chat_template(tok):
    row = data_prep.sft_row(tok, "question", "answer", DatasetConfig(paths=["x.jsonl"]))
    assert row == {"texts": ["<|user|>\nquestion\n<|assistant|>\n", "answer<|end|>\n"], "train": [False, True]}


def test_multiturn_segments_train_exactly_the_assistant_turns(tok):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    row = data_prep.sft_row(tok, messages, None, DatasetConfig(paths=["x.jsonl"], multiturn=True))
    texts, train = row["texts"], row["train"]
    assert train == [False, True, False, True]
    assert "".join(texts) == tok.apply_chat_template(messages, tokenize=False)
    assert [t for t, tr in zip(texts, train) if tr] == ["hi there<|end|>\n", "4<|end|>\n"]
    assert [t for t, tr in zip(texts, train) if not tr] == [
        "<|system|>\nbe brief\n<|user|>\nhello\n<|assistant|>\n",
        "<|user|>\n2+2?\n<|assistant|>\n",
    ]
    ids, labels = encode_segments(tok, texts, train)
    assert tok.decode(ids) == "".join(texts)
    trained_ids = [t for t in labels if t != IGNORE_INDEX]
    assert tok.decode(trained_ids) == "hi there<|end|>\n4<|end|>\n"
    # the trained tokens are exactly the two assistant answers, each ending with EOS
    assert trained_ids.count(tok.eos_token_id) == 2


def test_multiturn_needs_a_conversation(tok):
    with pytest.raises(DataError, match="multiturn rows need a list"):
        data_prep.sft_row(tok, "just text", None, DatasetConfig(paths=["x.jsonl"], multiturn=True))


def test_pref_row_plain_and_conversation(tok):
    cfg = DatasetConfig(paths=["x.jsonl"], input_key="prompt", margin_key="m")
    row = data_prep._pref_row(tok, {"prompt": "q", "chosen": "good", "rejected": "bad", "m": 2}, cfg)
    assert row == {
        "prompt": "<|user|>\nq\n<|assistant|>\n", "chosen": "good" + EOS, "rejected": "bad" + EOS, "margin": 2.0,
    }
    conv = DatasetConfig(paths=["x.jsonl"], apply_chat_template=False, input_template="User: {}\nAssistant: ")
    user = {"role": "user", "content": "q"}
    row = data_prep._pref_row(
        tok,
        {"chosen": [user, {"role": "assistant", "content": "good"}], "rejected": [user, {"role": "assistant", "content": "bad"}]},
        conv,
    )
    assert row == {"prompt": "User: q\nAssistant: ", "chosen": "good" + EOS, "rejected": "bad" + EOS, "margin": 0.0}


def test_pref_row_whose_conversations_hold_only_the_reply_takes_the_prompt_from_input_key(tok):
    """OpenRLHF's common layout: `prompt` text, chosen / rejected as [{assistant reply}]."""
    cfg = DatasetConfig(paths=["x.jsonl"], input_key="prompt")
    row = data_prep._pref_row(tok, {"prompt": "q", "chosen": [{"role": "assistant", "content": "good"}],
                                    "rejected": [{"role": "assistant", "content": "bad"}]}, cfg)
    assert row["prompt"] == "<|user|>\nq\n<|assistant|>\n"
    assert (row["chosen"], row["rejected"]) == ("good" + EOS, "bad" + EOS)


# --- row checks ----------------------------------------------------------------------------------


def _prepared(tok, rows, max_len=64, strict=True, field="texts"):
    preparer = data_prep.RowPreparer(tok, (field,), (), max_len, strict, functools.partial(data_prep.row_number, "sft_data/train"))
    ds, dropped = data_prep.prepare("sft_data/train", datasets.Dataset.from_list(rows), preparer, 1, None)
    return prepared_data.rows(ds), dropped


def test_prepare_names_dataset_and_row_of_an_over_long_row(tok):
    rows = [data_prep.sft_row(tok, "q", "a", None), data_prep.sft_row(tok, "q", "a" * 200, None)]
    n_tokens = len(encode_segments(tok, rows[1]["texts"], rows[1]["train"])[0])
    with pytest.raises(DataError) as err:
        _prepared(tok, rows)
    assert str(err.value) == f"sft_data/train row 1: {n_tokens} tokens, longer than data.max_len=64 (data.strict_lengths)"
    assert _prepared(tok, rows[:1]) == (rows[:1], 0)  # the short row passes
    assert _prepared(tok, rows, strict=False) == (rows[:1], 1)  # dropped and counted
    with pytest.raises(DataError, match=r"^sft_data/train: every row is longer than data.max_len=64; raise data.max_len$"):
        _prepared(tok, rows[1:], strict=False)


def test_prepared_sft_rows_carry_the_ids_and_loss_mask_of_their_segments(tok):
    """What SFT trains on is what tokenizing each segment on its own gives (a hand-made row: the mask is 0 on the
    prompt's tokens, 1 on the response's), read back through TokenRows as (ids, labels)."""
    row = {"texts": ["Q: 1+1?", " 2" + EOS], "train": [False, True]}
    preparer = data_prep.RowPreparer(tok, ("texts",), (), 64, True, functools.partial(data_prep.row_number, "x"))
    ds, _ = data_prep.prepare("sft_data/train", datasets.Dataset.from_list([row]), preparer, 1, None)
    prompt = tok("Q: 1+1?", add_special_tokens=False)["input_ids"]
    response = tok(" 2" + EOS, add_special_tokens=False)["input_ids"]
    assert ds[0]["input_ids"] == prompt + response
    assert ds[0]["loss_mask"] == [0] * len(prompt) + [1] * len(response)
    rows = prepared_data.MappedRows(ds, prepared_data.TOKEN_COLUMNS, prepared_data.ids_and_labels)
    assert rows[0] == (prompt + response, [-100] * len(prompt) + response)


def test_an_over_long_file_row_is_dropped_and_counted_or_with_strict_lengths_an_error_naming_its_line(tok, model_dir, tmp_path):
    rows = qa_rows(8)
    rows[2]["output"] = "a" * 400
    sft = write_jsonl(tmp_path / "sft.jsonl", rows)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 4)
    cfg = files_config(model_dir, _sft_cfg(sft), _sft_cfg(prompts), max_len=64)
    dropped: dict[str, int] = {}
    out = file_rows(cfg, tok, dropped)
    assert len(out["sft_data"]["train"]) + len(out["sft_data"]["eval"]) == 7
    assert dropped["sft_data/train"] + dropped["sft_data/eval"] == 1 and dropped["prompts/train"] == 0
    strict = files_config(model_dir, _sft_cfg(sft), _sft_cfg(prompts), max_len=64, strict_lengths=True)
    with pytest.raises(DataError, match=rf"^{sft} line 3: \d+ tokens, longer than data.max_len=64 \(data.strict_lengths\)$"):
        file_rows(strict, tok)


def test_prepare_an_empty_dataset_and_an_empty_field(tok):
    with pytest.raises(DataError, match=r"^sft_data/train: dataset is empty$"):
        _prepared(tok, [])
    with pytest.raises(DataError, match=r"^sft_data/train row 1: empty 'prompt'$"):
        _prepared(tok, [{"prompt": "x"}, {"prompt": "  "}], field="prompt")


def _sft_cfg(path, **kw):
    return {"paths": [str(path)], "eval_ratio": 0.5, **kw}


@pytest.mark.parametrize("empty", ["", "   ", None])
def test_empty_output_is_a_data_error_naming_the_row(tok, model_dir, tmp_path, empty):
    rows = qa_rows(3)
    rows[2]["output"] = empty
    sft = write_jsonl(tmp_path / "sft.jsonl", rows)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 4)
    cfg = files_config(model_dir, _sft_cfg(sft), {"paths": [str(prompts)], "eval_ratio": 0.5})
    with pytest.raises(DataError) as err:
        file_rows(cfg, tok)
    assert str(err.value) == (f"{sft} line 3: 'output' (data.sft.output_key) is missing or empty; "
                              "give it a value or remove the row")


def test_empty_prompt_and_label_are_data_errors_naming_the_row(tok, model_dir, tmp_path):
    sft = write_jsonl(tmp_path / "sft.jsonl", qa_rows(2))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}, {"input": "", "label": "2"}])
    cfg = files_config(model_dir, _sft_cfg(sft), _sft_cfg(prompts))
    with pytest.raises(DataError, match=rf"^{prompts} line 2: 'input' \(data\.prompts\.input_key\) is missing or empty;"):
        file_rows(cfg, tok)
    prompts.write_text('{"input": "q", "label": "1"}\n{"input": "q"}\n')  # a key missing from one line
    with pytest.raises(DataError, match=rf"^{prompts} line 2: 'label' \(data\.prompts\.label_key\) is missing or empty;"):
        file_rows(cfg, tok)


def test_file_datasets_multiturn_and_preference_with_optional_prompt(tok, model_dir, tmp_path):
    conv = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "ok"},
    ]
    # every row twice: one of each pair is held out for eval, and train and eval rows are alike
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"messages": conv}] * 2)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": 5}, {"input": "r", "label": 6}])
    pref_a = write_jsonl(tmp_path / "pa.jsonl", [{"prompt": "q", "chosen": "good", "rejected": "bad"}] * 2)
    pref_b = write_jsonl(tmp_path / "pb.jsonl", [{"chosen": "yes", "rejected": "no"}] * 2)  # no prompt column
    cfg = files_config(
        model_dir,
        _sft_cfg(sft, input_key="messages", multiturn=True),
        {"paths": [str(prompts)], "eval_ratio": 0.5},
        preference={"paths": [str(pref_a), str(pref_b)], "input_key": "prompt", "eval_ratio": 0.5},
    )
    out = file_rows(cfg, tok)
    assert out["sft_data"]["train"] == out["sft_data"]["eval"] == [
        {
            "texts": ["<|user|>\nhello\n<|assistant|>\n", "hi<|end|>\n", "<|user|>\nbye\n<|assistant|>\n", "ok<|end|>\n"],
            "train": [False, True, False, True],
        }
    ]
    assert out["pref_data"]["train"] == out["pref_data"]["eval"] == [
        {"prompt": "<|user|>\nq\n<|assistant|>\n", "chosen": "good" + EOS, "rejected": "bad" + EOS, "margin": 0.0},
        # a source without the prompt column gets None, rendered as an empty user turn
        {"prompt": "<|user|>\n\n<|assistant|>\n", "chosen": "yes" + EOS, "rejected": "no" + EOS, "margin": 0.0},
    ]
    # labels become strings; one of the two prompts is held out for eval
    assert len(out["prompts"]["train"]) == 1 and len(out["eval_data"]["eval"]) == 1
    assert {r["label"] for r in out["prompts"]["train"] + out["eval_data"]["eval"]} == {"5", "6"}


# --- the stage: preflight and run ----------------------------------------------------------------


def test_run_on_files_writes_every_dataset_and_a_base_model_pointer(model_dir, tmp_path):
    sft = write_jsonl(tmp_path / "sft.jsonl", qa_rows(10))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": f"q{i}", "label": i} for i in range(8)])
    cfg = files_config(
        model_dir,
        {"paths": [str(sft)], "eval_ratio": 0.2, "apply_chat_template": False, "input_template": "User: {}\nAssistant: "},
        {"paths": [str(prompts)], "eval_ratio": 0.25},
        max_len=64,
    )
    preflight.check_inputs(cfg)
    result = run_stage(cfg, tmp_path)
    out = tmp_path / "out"
    assert set(result.outputs) == {"base_model", "sft_data", "prompts", "eval_data"}
    assert result.outputs["base_model"] == out / "base_model"
    assert json.loads((out / "base_model" / checkpoint_paths.POINTER_FILE).read_text()) == {"name_or_path": str(model_dir)}
    assert checkpoint_paths.resolve(out / "base_model") == str(model_dir)

    sft_train, sft_eval = (prepared_data.read_split(out / "sft_data", split) for split in ("train", "eval"))
    assert (len(sft_train), len(sft_eval)) == (8, 2)
    for row in sft_train + sft_eval:
        i = row["texts"][0].removeprefix("User: q").removesuffix("\nAssistant: ")
        assert row == {"texts": [f"User: q{i}\nAssistant: ", f"a{i}{EOS}"], "train": [False, True]}
    assert sorted(r["texts"][1] for r in sft_train + sft_eval) == sorted(f"a{i}{EOS}" for i in range(10))

    prompt_train = prepared_data.read_split(out / "prompts", "train")
    prompt_eval = prepared_data.read_split(out / "eval_data", "eval")
    assert (len(prompt_train), len(prompt_eval)) == (6, 2)
    assert not (out / "prompts" / "eval").exists()
    for row in prompt_train + prompt_eval:  # the chat template renders prompts; labels become strings
        assert row == {"prompt": f"<|user|>\nq{row['label']}\n<|assistant|>\n", "label": row["label"]}
    assert sorted(int(r["label"]) for r in prompt_train + prompt_eval) == list(range(8))

    assert result.metrics == {
        "rows/sft_data/train": 8.0, "rows/sft_data/eval": 2.0, "rows/prompts/train": 6.0, "rows/eval_data/eval": 2.0,
        "rows/sft_data/train/dropped": 0.0, "rows/sft_data/eval/dropped": 0.0, "rows/prompts/train/dropped": 0.0,
        "rows/eval_data/eval/dropped": 0.0,
    }


def test_run_rejects_an_over_long_row_naming_dataset_and_row(model_dir, tmp_path):
    rows = qa_rows(4)
    rows[3]["output"] = "long answer " * 20
    sft = write_jsonl(tmp_path / "sft.jsonl", rows)
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 2)
    cfg = files_config(model_dir, _sft_cfg(sft), {"paths": [str(prompts)], "eval_ratio": 0.5}, max_len=32, strict_lengths=True)
    with pytest.raises(DataError, match=rf"^{sft} line 4: \d+ tokens, longer than data\.max_len=32 \(data\.strict_lengths\)$"):
        run_stage(cfg, tmp_path)
    assert not (tmp_path / "out" / "sft_data").exists()


def test_every_dataset_needs_eval_rows_before_any_work(model_dir, tmp_path):
    sft = write_jsonl(tmp_path / "sft.jsonl", qa_rows(2))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 2)
    cfg = files_config(model_dir, _sft_cfg(sft), _sft_cfg(prompts, eval_ratio=0.0))
    message = ("data.prompts: no rows held out for eval (eval_ratio=0.0 of 2 rows); set data.prompts.eval_ratio "
               "above 0 or data.prompts.eval_split (holding rows out needs at least 2)")
    for check in (preflight.check_inputs, lambda c: run_stage(c, tmp_path)):
        with pytest.raises(DataError) as err:
            check(cfg)
        assert str(err.value) == message
    one_row = write_jsonl(tmp_path / "one.jsonl", qa_rows(1))  # the default eval_ratio holds out nothing of one row
    cfg = files_config(model_dir, {"paths": [str(one_row)]}, {"paths": [str(prompts)], "eval_ratio": 0.5})
    with pytest.raises(DataError, match=r"^data\.sft: no rows held out for eval \(eval_ratio=0\.05 of 1 row\)"):
        preflight.check_inputs(cfg)


def test_preflight_catches_a_missing_column_before_run(model_dir, tmp_path):
    sft = write_jsonl(tmp_path / "sft.jsonl", qa_rows(3))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "answer": "1"}] * 2)
    cfg = files_config(model_dir, _sft_cfg(sft), {"paths": [str(prompts)], "label_key": "answer", "eval_ratio": 0.5})
    preflight.check_inputs(cfg)  # the renamed label_key is found: no error

    bad = files_config(model_dir, _sft_cfg(sft), {"paths": [str(prompts)], "eval_ratio": 0.5})
    with pytest.raises(DataError) as err:
        preflight.check_inputs(bad)
    assert str(err.value).startswith(f"{prompts}: missing column 'label' (set by data.prompts.label_key)")
    assert not (tmp_path / "out").exists()


def test_preflight_reads_the_first_rows_and_data_prep_every_row(model_dir, tmp_path):
    """The driver checks the first PREVIEW_ROWS rows of a file, at a cost that does not grow with it; a row past
    them (here not even JSON) is data prep's to find, naming the same line."""
    n = data_files.PREVIEW_ROWS
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps(r) + "\n" for r in qa_rows(n + 5)) + "{not json\n")
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 2)
    cfg = files_config(model_dir, _sft_cfg(sft), _sft_cfg(prompts))
    preflight.check_inputs(cfg)  # the first rows are fine
    with pytest.raises(DataError, match=rf"^{sft} line {n + 6}: not valid JSON"):
        run_stage(cfg, tmp_path)
    rows = qa_rows(n + 5)
    rows[3]["output"] = 7
    write_jsonl(sft, rows)
    with pytest.raises(DataError, match=rf"^{sft} line 4: 'output' \(data.sft.output_key\)"):
        preflight.check_inputs(cfg)  # one of the first rows: the driver names it


def test_preflight_cuts_csv_by_records_and_reads_parquet_and_json_arrays(model_dir, tmp_path):
    n = data_files.PREVIEW_ROWS
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 2)
    csv_file = tmp_path / "sft.csv"  # a quoted field over two lines: the records, not the lines, are counted
    csv_file.write_text("input,output\n" + "".join(f'"q{i}\nmore",a{i}\n' for i in range(n + 5)) + "q,\n")
    cfg = files_config(model_dir, _sft_cfg(csv_file), _sft_cfg(prompts))
    preflight.check_inputs(cfg)  # the empty output of the last record is past the first rows
    with pytest.raises(DataError, match=rf"^{csv_file} line {2 * (n + 5) + 2}: 'output' \(data.sft.output_key\)"):
        run_stage(cfg, tmp_path)
    bad_first = tmp_path / "first.csv"
    bad_first.write_text('input,output\n"q\nmore",a\nq,\n')
    with pytest.raises(DataError, match=rf"^{bad_first} line 4: 'output' \(data.sft.output_key\)"):
        preflight.check_inputs(files_config(model_dir, _sft_cfg(bad_first), _sft_cfg(prompts)))
    parquet = tmp_path / "sft.parquet"
    datasets.Dataset.from_list([*qa_rows(n + 5), {"input": "q", "output": ""}]).to_parquet(str(parquet))
    preflight.check_inputs(files_config(model_dir, _sft_cfg(parquet), _sft_cfg(prompts)))
    array = tmp_path / "sft.json"  # a JSON array cannot be cut: read whole, its last row checked too
    array.write_text(json.dumps([*qa_rows(n + 5), {"input": "q", "output": ""}]))
    with pytest.raises(DataError, match=rf"^{array} row {n + 6}: 'output' \(data.sft.output_key\)"):
        preflight.check_inputs(files_config(model_dir, _sft_cfg(array), _sft_cfg(prompts)))


def test_preflight_says_when_it_counted_only_the_first_rows(model_dir, tmp_path):
    n = data_files.PREVIEW_ROWS
    sft = write_jsonl(tmp_path / "sft.jsonl", qa_rows(n + 5))
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 2)
    cfg = files_config(model_dir, _sft_cfg(sft, eval_ratio=0.0), _sft_cfg(prompts))
    with pytest.raises(DataError, match=rf"^data\.sft: no rows held out for eval \(eval_ratio=0\.0 of {n}\+ rows\)"):
        preflight.check_inputs(cfg)


def test_preflight_catches_a_missing_file(model_dir, tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 2)
    missing = tmp_path / "missing.parquet"
    cfg = files_config(model_dir, _sft_cfg(missing), _sft_cfg(prompts))
    with pytest.raises(DataError, match=f"^{missing}: no such file$"):
        preflight.check_inputs(cfg)


def test_a_bad_multiturn_row_is_named(tok, model_dir, tmp_path):
    conv = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"messages": conv}, {"messages": []}])
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "q", "label": "1"}] * 2)
    cfg = files_config(model_dir, _sft_cfg(sft, input_key="messages", multiturn=True), _sft_cfg(prompts))
    with pytest.raises(DataError, match=rf"^{sft} line 2: 'messages' \(data\.sft\.input_key\) is missing or empty;"):
        file_rows(cfg, tok)


@pytest.mark.parametrize(("n", "ratio", "min_rows", "expected"), [
    (200, 0.05, 100, 40),    # the ratio alone: 10; at least 100, but at most a fifth of the source
    (5000, 0.05, 100, 250),  # the ratio wins on a large source
    (1000, 0.02, 100, 100),  # the minimum wins
    (200, 0.5, 100, 100),    # an explicit large ratio is kept
    (200, 0.0, 100, 0),      # no ratio: nothing held out
    (1, 0.5, 100, 0),        # one row cannot be split
    (3, 0.05, 100, 1),
    (2, 0.9, 0, 1),          # a train row always remains
])
def test_held_out_rows(n, ratio, min_rows, expected):
    assert data_files.held_out_rows(n, ratio, min_rows) == expected


def test_the_minimum_held_out_count_is_shared_by_the_paths(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in qa_rows(500, "a")))
    b.write_text("".join(json.dumps(r) + "\n" for r in qa_rows(500, "b")))
    train, ev = load([a, b], eval_ratio=0.02, eval_min_rows=100)
    assert (len(train), len(ev)) == (900, 100)  # 50 from each; the ratio alone held out 20
