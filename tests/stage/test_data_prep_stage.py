import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from configs import DataError, load_config
from stages.data import prepared as prepared_data
from stages.data_prep import stage as data_prep
from stages.data_prep.tiny_model import STEP
from tests.stage.conftest import FAST, make_ctx


def test_outputs_are_written(prepared):
    assert set(prepared) == {"base_model", "sft_data", "pref_data", "prm_data", "prompts", "eval_data"}
    counts = {name: {split: len(prepared_data.load(prepared[name], split)) for split in prepared_data.manifest(prepared[name])}
              for name in prepared if name != "base_model"}
    assert counts == {
        "sft_data": {"train": 400, "eval": 40},
        "pref_data": {"train": 400, "eval": 40},
        "prm_data": {"train": 400, "eval": 40},
        "prompts": {"train": 40},
        "eval_data": {"eval": 40},
    }
    assert {split: entry["rows"] for split, entry in prepared_data.manifest(prepared["sft_data"]).items()} == {"train": 400, "eval": 40}


def test_base_model_is_an_hf_checkpoint_with_chat_template(prepared):
    tok = AutoTokenizer.from_pretrained(prepared["base_model"])
    model = AutoModelForCausalLM.from_pretrained(prepared["base_model"])
    assert tok.chat_template and tok.eos_token == "<|end|>"
    row = prepared_data.read_split(prepared["eval_data"], "eval")[0]
    assert row["prompt"].startswith("<|user|>\nCompute ") and row["prompt"].endswith("<|assistant|>\n")
    ids = tok(row["prompt"], return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape == (1, ids.shape[1] + 3)


def test_rows_have_the_documented_shapes(prepared):
    sft = prepared_data.read_split(prepared["sft_data"], "train")[0]
    assert sft["train"] == [False, True] and sft["texts"][1].endswith("<|end|>\n")
    pref = prepared_data.read_split(prepared["pref_data"], "train")[0]
    assert pref["chosen"] != pref["rejected"] and pref["chosen"].endswith("<|end|>")
    prm = prepared_data.read_split(prepared["prm_data"], "train")[0]
    assert prm["response"].count(STEP) == len(prm["labels"]) and set(prm["labels"]) <= {"+", "-"}


def test_same_seed_same_data_other_seed_other_data(prepared, fast_config, tmp_path):
    again = data_prep.run(make_ctx("data_prep", fast_config, tmp_path / "a"), {}).outputs
    for name in ("sft_data", "pref_data", "prm_data", "prompts", "eval_data"):  # the same rows, ids and digests
        assert prepared_data.manifest(again[name]) == prepared_data.manifest(prepared[name])
    assert prepared_data.load(again["sft_data"], "train").to_list() == prepared_data.load(prepared["sft_data"], "train").to_list()
    w1 = load_file(prepared["base_model"] / "model.safetensors")
    w2 = load_file(again["base_model"] / "model.safetensors")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    other = data_prep.run(make_ctx("data_prep", load_config(None, [*FAST, "seed=7"]), tmp_path / "b"), {}).outputs
    assert prepared_data.manifest(other["sft_data"])["train"]["sha256"] != prepared_data.manifest(prepared["sft_data"])["train"]["sha256"]


def test_over_long_rows_fail_naming_dataset_and_row_with_strict_lengths(tmp_path):
    cfg = load_config(None, [*FAST, "data.max_len=20", "data.strict_lengths=true"])
    with pytest.raises(DataError, match=r"^sft_data/train row 0: \d+ tokens, longer than data.max_len=20 \(data.strict_lengths\)$"):
        data_prep.run(make_ctx("data_prep", cfg, tmp_path), {})


def test_the_gsm8k_preset_on_a_local_model_and_local_files(tmp_path):
    """The GPU preset, unchanged but for local paths: GSM8K-shaped rows, the reference answer taken
    from the solution by `label_pattern`; a label without a match is a one-line error naming it."""
    from tests.tiny_checkpoint import save_tiny_checkpoint

    rows = [{"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i}+2={i + 2}\n#### {i + 2}"} for i in range(20)]
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    local = save_tiny_checkpoint([r["question"] + r["answer"] for r in rows], tmp_path / "model", vocab_size=96)
    local_paths = [f"model.name_or_path={local}", f"data.sft.paths=[{data}]", f"data.prompts.paths=[{data}]",
                   "data.sft.eval_split=null", "data.prompts.eval_split=null", "data.sft.eval_ratio=0.2",
                   "data.prompts.eval_ratio=0.2"]
    cfg = load_config("qwen2.5-0.5b-gsm8k", local_paths)
    out = data_prep.run(make_ctx("data_prep", cfg, tmp_path / "run"), {}).outputs
    prompts = prepared_data.read_split(out["prompts"], "train")
    answers = {r["answer"].rsplit("#### ", 1)[1] for r in rows}
    assert len(prompts) == 16 and all(p["label"] in answers for p in prompts)
    assert {"pref_data", "prm_data"}.isdisjoint(out)  # no preference data: rm, prm and dpo are skipped

    data.write_text(data.read_text().replace("#### 7", "seven"))  # row 5: the file's line 6
    with pytest.raises(DataError, match=rf"^{data} line 6: 'answer' '.*seven' has no match for data.prompts.label_pattern"):
        data_prep.run(make_ctx("data_prep", cfg, tmp_path / "again"), {})


def test_an_eval_dataset_of_its_own_holds_out_every_row_of_its_split(tmp_path):
    """data.eval_prompts (OpenRLHF's --eval.dataset, --eval.split): eval_data is every row of that file, read with
    its own keys; the prompts file then trains on all its rows. A row it cannot read names data.eval_prompts."""
    from tests.tiny_checkpoint import save_tiny_checkpoint

    def write(name: str, rows: list[dict]):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    train = write("train.jsonl", [{"q": f"Compute {i}+1", "a": str(i + 1)} for i in range(30)])
    held = write("held.jsonl", [{"question": f"Compute {i}+2", "answer": str(i + 2)} for i in range(7)])
    local = save_tiny_checkpoint([f"Compute {i}+1 {i + 1}" for i in range(30)], tmp_path / "model", vocab_size=96)
    common = [f"model.name_or_path={local}", "data.source=files", f"data.sft.paths=[{train}]", "data.sft.input_key=q",
              "data.sft.output_key=a", f"data.prompts.paths=[{train}]", "data.prompts.input_key=q", "data.prompts.label_key=a",
              "data.prompts.apply_chat_template=false", "data.sft.apply_chat_template=false"]
    cfg = load_config(None, [*common, f"data.eval_prompts.paths=[{held}]", "data.eval_prompts.input_key=question",
                             "data.eval_prompts.label_key=answer", "data.eval_prompts.apply_chat_template=false"])
    out = data_prep.run(make_ctx("data_prep", cfg, tmp_path / "run"), {}).outputs
    assert [r["label"] for r in prepared_data.read_split(out["eval_data"], "eval")] == [str(i + 2) for i in range(7)]
    assert [r["prompt"] for r in prepared_data.read_split(out["eval_data"], "eval")][:2] == ["Compute 0+2", "Compute 1+2"]
    assert len(prepared_data.read_split(out["prompts"], "train")) == 30  # none held out of the training prompts

    held.write_text(held.read_text().replace('"answer": "4"', '"answer": null'))  # row 2: the file's line 3
    with pytest.raises(DataError, match=rf"^{held} line 3: .*data.eval_prompts.label_key"):
        data_prep.run(make_ctx("data_prep", cfg, tmp_path / "again"), {})
    with pytest.raises(Exception, match=r"data.eval_prompts is a file dataset: set data.source: files"):
        load_config(None, [f"data.eval_prompts.paths=[{held}]"])
