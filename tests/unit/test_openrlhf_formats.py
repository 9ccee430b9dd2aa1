"""OpenRLHF's data formats on `data.source: files`: Math-Shepherd PRM rows (`data.prm`), KTO's unpaired
rows (`data.preference.unpaired`), continued pre-training (`sft.pretrain_mode`) and a replacement chat
template (`data.tokenizer_chat_template`). Expected rows are written out by hand.

Everything is local and tiny: a BPE tokenizer trained on a few lines and a 1-layer Llama checkpoint.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import datasets
import pytest

from configs import load_config
from configs.errors import ConfigError, DataError
from configs.schema import PipelineConfig, TinyModelConfig
from stages.common import checkpoint, checkpoint_paths
from stages.dag import declaration as dag
from stages.dag.contract import StageContext
from stages.data import chat_template, prm_rows
from stages.data_prep import stage as data_prep
from stages.data_prep import tiny_model
from stages.dpo import stage as dpo
from tests.prepared_rows import file_rows

EOS = tiny_model.EOS
PH = "ки"  # Math-Shepherd's step placeholder
CHAT = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module", autouse=True)
def _isolated_datasets_cache(tmp_path_factory):
    old_cache = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = tmp_path_factory.mktemp("hf_datasets_cache")
    datasets.disable_progress_bars()
    yield
    datasets.enable_progress_bars()
    datasets.config.HF_DATASETS_CACHE = old_cache


def new_tokenizer():
    # every printable character is in the corpus; the Cyrillic placeholder is not (data prep adds it)
    return tiny_model.train_tokenizer([string.printable, "Compute Answer: question answer hello world"], 96)


@pytest.fixture
def tok():
    return new_tokenizer()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = new_tokenizer()
    cfg = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2)
    return checkpoint.save(tiny_model.build_model(cfg, tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp("ckpt") / "model")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def base_files(tmp_path: Path) -> dict:
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"input": f"q{i}", "output": f"a{i}"} for i in range(4)])
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"input": f"q{i}", "label": i} for i in range(4)])
    return {"sft": {"paths": [str(sft)], "eval_ratio": 0.5}, "prompts": {"paths": [str(prompts)], "eval_ratio": 0.5}}


def files_config(model_dir: Path, tmp_path: Path, data: dict | None = None, **sections) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "seed": 0, "model": {"name_or_path": str(model_dir)},
        "data": {"source": "files", **base_files(tmp_path), **(data or {})}, **sections,
    })


def both_splits(out: dict, name: str) -> list[dict]:
    return out[name]["train"] + out[name]["eval"]


# --- PRM rows (data.prm) -------------------------------------------------------------------------

SHEPHERD = [
    # OpenRLHF's form: the labels as a list
    {"input": f"Compute 2+3 2+3=5 {PH}\nAnswer: 5 {PH}", "label": ["+", "+"]},
    # Math-Shepherd's own: the text with each placeholder replaced by its label (the text has a + of its own)
    {"input": f"Compute 7-1+4 7-1=6 {PH}\n6+4=11 {PH}\nAnswer: 11 {PH}",
     "label": "Compute 7-1+4 7-1=6 +\n6+4=11 -\nAnswer: 11 -"},
]


def test_math_shepherd_rows_become_prm_data_rows(tok, model_dir, tmp_path):
    prm = write_jsonl(tmp_path / "shepherd.jsonl", SHEPHERD)
    cfg = files_config(model_dir, tmp_path, {"prm": {"paths": [str(prm)], "eval_ratio": 0.5}}, prm={"placeholder_token": PH})
    assert data_prep.add_placeholder_token(tok, PH)  # the tokenizer read it as unknown characters
    out = file_rows(cfg, tok)
    assert len(out["prm_data"]["train"]) == len(out["prm_data"]["eval"]) == 1
    assert sorted(both_splits(out, "prm_data"), key=lambda r: len(r["labels"])) == [
        {"prompt": "", "response": "Compute 2+3 2+3=5 ки\nAnswer: 5 ки", "labels": ["+", "+"]},
        {"prompt": "", "response": "Compute 7-1+4 7-1=6 ки\n6+4=11 ки\nAnswer: 11 ки", "labels": ["+", "-", "-"]},
    ]


def test_a_row_whose_labels_do_not_match_its_placeholders_is_one_line_naming_file_line_and_counts(tok, model_dir, tmp_path):
    rows = [*SHEPHERD, {"input": f"Compute 1+1 1+1=2 {PH}\nAnswer: 2 {PH}", "label": ["+", "+", "-"]}]
    prm = write_jsonl(tmp_path / "shepherd.jsonl", rows)
    cfg = files_config(model_dir, tmp_path, {"prm": {"paths": [str(prm)], "eval_ratio": 0.5}}, prm={"placeholder_token": PH})
    data_prep.add_placeholder_token(tok, PH)
    with pytest.raises(DataError) as err:
        file_rows(cfg, tok)
    assert str(err.value) == (f"{prm} line 3: 'input' has 2 step placeholders 'ки' but 'label' has 3 step labels; "
                              "give one of + / - per step")


@pytest.mark.parametrize(("label", "expected"), [
    ("+-", ["+", "-"]),  # the labels alone
    ("+ -", ["+", "-"]),
    ("9+3=12 +\nAnswer: 12 -", ["+", "-"]),  # Math-Shepherd's
])
def test_step_labels_from_a_string(label, expected):
    assert prm_rows.step_labels(f"9+3=12 {PH}\nAnswer: 12 {PH}", label, PH, ("+", "-")) == expected


@pytest.mark.parametrize(("label", "message"), [
    ("9+3=12 +\nAnswer: 12 ", "'input' has 2 step placeholders 'ки' but 'label' has 1 step label; give one of + / - per step"),
    ("9+3=13 +\nAnswer: 12 -", "'label' is not 'input' with each 'ки' replaced by its step label: they differ from character 5"),
    (["+", "?"], "'label' holds the step label '?', not one of prm.reward_tokens + / -"),
])
def test_step_labels_that_do_not_fit_the_text(label, message):
    with pytest.raises(DataError) as err:
        prm_rows.step_labels(f"9+3=12 {PH}\nAnswer: 12 {PH}", label, PH, ("+", "-"))
    assert str(err.value) == message


def test_a_text_without_placeholders_is_an_error():
    with pytest.raises(DataError, match=r"^'input' has no step placeholder 'ки' \(prm.placeholder_token\)"):
        prm_rows.step_labels("9+3=12", ["+"], PH, ("+", "-"))


def test_with_data_prm_data_prep_makes_prm_data_and_the_prm_stage_runs(model_dir, tmp_path):
    cfg = files_config(model_dir, tmp_path, {"prm": {"paths": [str(tmp_path / "p.jsonl")]}})
    assert "prm_data" in dag.BY_NAME["data_prep"].outputs and dag.BY_NAME["prm"].wanted_inputs(cfg) == ("sft_model", "prm_data")
    assert "data.prm.paths" in dag.BY_NAME["data_prep"].local_sources
    assert data_prep.has_prm_rows(cfg) and not data_prep.has_prm_rows(files_config(model_dir, tmp_path))
    from stages.dag.plan import plan

    assert plan(cfg)["prm"].line() == "runs"
    assert plan(files_config(model_dir, tmp_path))["prm"].line() == "off: no PRM data (data.prm)"


def test_prm_rows_are_one_text_each():
    for key, value in (("multiturn", "true"), ("input_template", "'Q {}'")):
        with pytest.raises(ConfigError, match=rf"data.prm.{key}: PRM rows are one text each"):
            load_config(None, ["data.prm.paths=[x.jsonl]", f"data.prm.{key}={value}"])


# --- KTO's unpaired rows (data.preference.unpaired) ----------------------------------------------


def test_unpaired_rows_load_as_one_response_each_with_a_boolean_label(tok, model_dir, tmp_path):
    rows = [{"input": "q", "output": "good", "label": True}, {"input": "q", "output": "bad", "label": False},
            {"input": "r", "output": "fine", "label": True}, {"input": "r", "output": "wrong", "label": False}]
    pref = write_jsonl(tmp_path / "kto.jsonl", rows)
    cfg = files_config(model_dir, tmp_path, {"preference": {"paths": [str(pref)], "unpaired": True, "eval_ratio": 0.5}},
                       dpo={"loss": "kto"})
    out = file_rows(cfg, tok)
    assert sorted(both_splits(out, "pref_data"), key=lambda r: r["response"]) == [
        {"prompt": "<|user|>\nq\n<|assistant|>\n", "response": "bad" + EOS, "desirable": False},
        {"prompt": "<|user|>\nr\n<|assistant|>\n", "response": "fine" + EOS, "desirable": True},
        {"prompt": "<|user|>\nq\n<|assistant|>\n", "response": "good" + EOS, "desirable": True},
        {"prompt": "<|user|>\nr\n<|assistant|>\n", "response": "wrong" + EOS, "desirable": False},
    ]
    # the dpo stage reads them as KTO's examples
    seqs, desirable = dpo.encode_examples(tok, out["pref_data"]["train"])
    assert dpo.is_unpaired(out["pref_data"]["train"][0]) and len(seqs) == len(desirable) == len(out["pref_data"]["train"])


def test_unpaired_labels_in_a_csv_file_are_text(tok, model_dir, tmp_path):
    csv = tmp_path / "kto.csv"
    csv.write_text("input,output,label\ns,yes,true\ns,no,False\nt,ok,1\nt,ko,0\n")
    cfg = files_config(model_dir, tmp_path, {"preference": {"paths": [str(csv)], "unpaired": True, "eval_ratio": 0.5}},
                       dpo={"loss": "kto"})
    out = file_rows(cfg, tok)
    assert sorted((r["response"], r["desirable"]) for r in both_splits(out, "pref_data")) == [
        ("ko" + EOS, False), ("no" + EOS, False), ("ok" + EOS, True), ("yes" + EOS, True)]


def test_an_unpaired_label_that_is_not_a_boolean_names_its_line(tok, model_dir, tmp_path):
    pref = write_jsonl(tmp_path / "kto.jsonl", [{"input": "q", "output": "a", "label": True},
                                                {"input": "q", "output": "b", "label": "maybe"}])
    cfg = files_config(model_dir, tmp_path, {"preference": {"paths": [str(pref)], "unpaired": True, "eval_ratio": 0.5}},
                       dpo={"loss": "kto"})
    with pytest.raises(DataError) as err:
        file_rows(cfg, tok)
    assert str(err.value) == (f"{pref} line 2: 'label' (data.preference.label_key) must be true or false (or 1 / 0), "
                              "not the string 'maybe'")


def test_kto_mismatches_an_unpaired_example_with_the_next_one_of_another_prompt():
    a, b, c = [1], [2], [3]
    examples = [(a, [10]), (a, [11]), (b, [12]), (c, [13])]
    objective = dpo.KTOObjective(PipelineConfig().dpo.model_copy(update={"loss": "kto"}), [], 0, 1,
                                 (examples, [True, False, True, False]))
    # 0 and 1 share prompt a: both take 2's completion; 2 takes 3's; 3 wraps round to 0's
    assert objective.sequences[4:] == [(a, [12]), (a, [12]), (b, [13]), (c, [10])]
    assert objective.collate(__import__("torch").zeros(8), [0, 1, 2, 3])["desirable"].tolist() == [True, False, True, False]


@pytest.mark.parametrize(("overrides", "message"), [
    (["dpo.loss=sigmoid"], "dpo.loss=sigmoid trains on (chosen, rejected) pairs, and data.preference.unpaired gives single "
                           "responses: set dpo.loss=kto, or give pairs (data.preference.unpaired=false)"),
    (["dpo.loss=ipo"], "dpo.loss=ipo trains on (chosen, rejected) pairs"),
    (["dpo.loss=kto", "reward.source=rm"], "reward.source=rm scores with the RM the rm stage trains on preference pairs, "
                                          "and data.preference.unpaired gives none"),
    (["dpo.loss=kto", "csft.enabled=true"], "csft.enabled scores the SFT data with the RM the rm stage trains"),
    (["dpo.loss=kto", "rl.algorithm.advantage_estimator=gae", "rl.critic.init_from=reward_model"],
     "rl.critic.init_from=reward_model starts the critic from the RM the rm stage trains on preference pairs, and "
     "data.preference.unpaired gives none: set inputs.reward_model"),
])
def test_paired_only_uses_of_unpaired_rows_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.preference.paths=[kto.jsonl]", "data.preference.unpaired=true", *overrides])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_with_unpaired_rows_the_rm_stage_is_off_and_cannot_be_asked_for():
    cfg = load_config(None, ["data.preference.paths=[kto.jsonl]", "data.preference.unpaired=true", "dpo.loss=kto"])
    rm = dag.BY_NAME["rm"]
    assert rm.run_when is not None and not rm.run_when(cfg) and rm.run_when(load_config(None, []))
    with pytest.raises(ConfigError, match=r"^--only rm: the RM trains on preference pairs"):
        dag.check_request(cfg, [], ["rm"])


# --- continued pre-training (sft.pretrain_mode) --------------------------------------------------


def test_pretrain_rows_are_plain_text_trained_on_every_token_and_cut_to_max_len(tok, model_dir, tmp_path):
    texts = ["hello world", "question answer", "x" * 100]  # the last is longer than max_len
    sft = write_jsonl(tmp_path / "plain.jsonl", [{"text": t} for t in texts])
    cfg = files_config(model_dir, tmp_path, {"sft": {"paths": [str(sft)], "input_key": "text", "eval_ratio": 0.3,
                                                     "input_template": "User: {}\nAssistant: "}, "max_len": 32},
                       sft={"pretrain_mode": True})
    out = file_rows(cfg, tok)
    rows = sorted(both_splits(out, "sft_data"), key=lambda r: r["texts"][0])
    cut = rows[-1]["texts"][0]
    assert rows[:2] == [{"texts": ["hello world"], "train": [True]}, {"texts": ["question answer"], "train": [True]}]
    assert rows[-1]["train"] == [True] and cut != "x" * 100 and ("x" * 100).startswith(cut)
    assert len(tok(cut, add_special_tokens=False)["input_ids"]) <= 32


def test_pretrain_mode_reads_text_files_only(model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"sft.pretrain_mode trains on plain-text rows read from files"):
        load_config(None, ["sft.pretrain_mode=true"])
    with pytest.raises(ValueError, match=r"csft.enabled with sft.pretrain_mode: conditional SFT puts a score in each prompt"):
        files_config(model_dir, tmp_path, sft={"pretrain_mode": True}, csft={"enabled": True})


# --- the chat template (data.tokenizer_chat_template) --------------------------------------------


def test_the_chat_template_replaces_the_tokenizers_for_every_dataset(model_dir, tmp_path):
    pref = write_jsonl(tmp_path / "pairs.jsonl", [{"input": "q", "chosen": "c", "rejected": "r"}] * 2)
    cfg = files_config(model_dir, tmp_path, {"tokenizer_chat_template": CHAT,
                                             "preference": {"paths": [str(pref)], "eval_ratio": 0.5}})
    tok = data_prep.tokenizer_for(cfg)
    out = file_rows(cfg, tok)
    assert out["prompts"]["train"][0]["prompt"] in ("[user] q0\n[assistant] ", "[user] q1\n[assistant] ",
                                                   "[user] q2\n[assistant] ", "[user] q3\n[assistant] ")
    assert out["pref_data"]["train"][0]["prompt"] == "[user] q\n[assistant] "
    assert out["pref_data"]["train"][0]["chosen"] == "c\n" + EOS  # what the template adds after the prompt, then EOS


def test_the_chat_template_from_a_file_is_saved_with_the_base_model(model_dir, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(CHAT)
    cfg = files_config(model_dir, tmp_path, {"tokenizer_chat_template": str(template)})
    assert dag.BY_NAME["data_prep"].wanted_config(dag.BY_NAME["data_prep"].local_sources, cfg)[-1] == "data.tokenizer_chat_template"
    ctx = StageContext(stage="data_prep", config=cfg, output_dir=tmp_path / "out", work_dir=tmp_path / "work")
    outputs = data_prep.run(ctx, {}).outputs
    base = outputs["base_model"]
    assert not (base / checkpoint_paths.POINTER_FILE).exists()  # a full copy: the checkpoint's tokenizer lacks it
    saved = checkpoint.load_tokenizer(base)
    assert saved.apply_chat_template([{"role": "user", "content": "7+1"}], tokenize=False,
                                     add_generation_prompt=True) == "[user] 7+1\n[assistant] "
    # an inline template is config, not a file whose content counts
    inline = files_config(model_dir, tmp_path, {"tokenizer_chat_template": CHAT})
    assert "data.tokenizer_chat_template" not in dag.BY_NAME["data_prep"].wanted_config(dag.BY_NAME["data_prep"].local_sources, inline)


@pytest.mark.parametrize(("value", "message"), [
    ("missing.jinja", "data.tokenizer_chat_template=missing.jinja: no such file, and not a Jinja template"),
    ("{% for m in messages %}", "data.tokenizer_chat_template: not a valid Jinja template (line 1: "),
])
def test_a_chat_template_that_is_not_one_is_a_config_error(model_dir, tmp_path, value, message):
    cfg = files_config(model_dir, tmp_path, {"tokenizer_chat_template": value})
    with pytest.raises(ConfigError) as err:
        chat_template.check(cfg)
    assert str(err.value).startswith(message)


def test_an_input_template_beside_the_chat_template_is_a_warning_and_the_chat_template_wins(model_dir, tmp_path, capsys):
    sft = write_jsonl(tmp_path / "sft2.jsonl", [{"input": "q", "output": "a"}] * 2)
    cfg = files_config(model_dir, tmp_path, {"tokenizer_chat_template": CHAT,
                                             "sft": {"paths": [str(sft)], "eval_ratio": 0.5, "input_template": "User: {}\n"}})
    assert chat_template.warnings(cfg) == [
        "warning: data.sft.input_template is not used: data.tokenizer_chat_template renders the prompts of data.sft "
        "(apply_chat_template is on); set data.sft.apply_chat_template=false to use the input template"]
    tok = data_prep.tokenizer_for(cfg)
    out = file_rows(cfg, tok)
    assert out["sft_data"]["train"][0]["texts"][0] == "[user] q\n[assistant] "
    assert "[data_prep] warning: data.sft.input_template is not used" in capsys.readouterr().out
    # with apply_chat_template off the input template renders the prompt (OpenRLHF's), and nothing is warned
    off = files_config(model_dir, tmp_path, {"tokenizer_chat_template": CHAT, "sft": {
        "paths": [str(sft)], "eval_ratio": 0.5, "input_template": "User: {}\n", "apply_chat_template": False}})
    assert chat_template.warnings(off) == []
    assert file_rows(off, tok)["sft_data"]["train"][0]["texts"] == ["User: q\n", "a" + EOS]
