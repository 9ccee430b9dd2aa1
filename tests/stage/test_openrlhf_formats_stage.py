"""OpenRLHF's data formats through the stages, on the tiny task written out as files: a PRM trained on a
Math-Shepherd file (`data.prm`, `ки` ending each step, `+` / `-` labels in Math-Shepherd's label string)
labels the held-out steps, and KTO on unpaired rows (`data.preference.unpaired`: the correct solutions
desirable, the flawed ones not) lifts the SFT policy's sampled held-out accuracy. Both start from one
short SFT run on the synthetic task (one-digit operands), shared by the module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from configs import load_config
from stages.common import checkpoint
from stages.data.prepared import read_split
from stages.data_prep import stage as data_prep
from stages.data_prep import synthetic_task
from stages.dpo import stage as dpo
from stages.eval import stage as evaluate
from stages.prm import stage as prm
from stages.rewards.factory import build_scorer
from stages.sft import stage as sft
from tests.model_families import FAMILIES, save_family_checkpoint
from tests.stage.conftest import make_ctx

pytestmark = pytest.mark.slow

PH = "ки"
# one-digit operands: the 0.86M model learns this task's arithmetic in a few hundred SFT steps (the preset's
# operands up to 20 take 1200: benchmarks.md has that run)
TASK = ["data.synthetic.num_train=2000", "data.synthetic.num_eval=100", "data.synthetic.num_prompts=40",
        "data.synthetic.max_operand=9", "eval.max_samples=100", "eval.samples_per_prompt=4"]
SFT_STEPS, PRM_STEPS, KTO_STEPS = 400, 150, 100
SFT = [f"sft.max_steps={SFT_STEPS}", f"sft.eval_every={SFT_STEPS}", f"sft.save_every={SFT_STEPS}"]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def shepherd(row: dict) -> dict:
    """A synthetic PRM row as Math-Shepherd ships one: the question and its steps in one text, `ки` ending
    each step; the label the same text with each placeholder replaced by its step's `+` / `-`."""
    text = row["prompt"] + "\n" + "\n".join(f"{step} {PH}" for step in row["steps"])
    return {"input": text, "label": text.replace(PH, "{}").format(*row["labels"])}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The synthetic task's data, an SFT policy trained on it, and its rows written as files."""
    root = tmp_path_factory.mktemp("formats")
    cfg = load_config(None, [*TASK, *SFT])
    prepared = data_prep.run(make_ctx("data_prep", cfg, root / "prep"), {}).outputs
    policy = sft.run(make_ctx("sft", cfg, root / "sft"), {k: prepared[k] for k in ("base_model", "sft_data")}).outputs
    splits = synthetic_task.generate(cfg.data.synthetic, cfg.seed)
    files = [
        "data.source=files", f"model.name_or_path={policy['sft_model']}",
        "data.sft.paths=[" + write_jsonl(root / "sft.jsonl", [{"input": r["prompt"], "output": r["response"]}
                                                             for r in splits.sft_train]) + "]",
        "data.prompts.paths=[" + write_jsonl(root / "prompts.jsonl", [{"input": r["prompt"], "label": r["label"]}
                                                                     for r in splits.prompts_train]) + "]",
    ]
    return {"root": root, "cfg": cfg, "prepared": prepared, "sft_model": policy["sft_model"], "splits": splits, "files": files}


def test_a_prm_trained_on_a_math_shepherd_file_labels_held_out_steps(task):
    root = task["root"]
    rows = [shepherd(r) for r in task["splits"].prm_train]
    assert rows[0]["input"].count(PH) == len(task["splits"].prm_train[0]["labels"])
    cfg = load_config(None, [*TASK, *SFT, *task["files"], "data.prm.paths=[" + write_jsonl(root / "shepherd.jsonl", rows) + "]",
                             "data.prm.eval_ratio=0.1", f"prm.placeholder_token={PH}", f"prm.max_steps={PRM_STEPS}",
                             f"prm.eval_every={PRM_STEPS}", f"prm.save_every={PRM_STEPS}"])
    made = data_prep.run(make_ctx("data_prep", cfg, root / "prep_prm"), {}).outputs
    held_out = read_split(made["prm_data"], "eval")
    assert len(held_out) == 200 and held_out[0]["prompt"] == "" and PH in held_out[0]["response"]
    # the base model here is the SFT policy with the placeholder's embedding added
    result = prm.run(make_ctx("prm", cfg, root / "prm"), {"sft_model": made["base_model"], "prm_data": made["prm_data"]})
    accuracy = result.metrics["eval/step_accuracy"]
    print(f"PRM step accuracy on {len(held_out)} held-out Math-Shepherd rows: {accuracy:.3f}")
    assert accuracy >= 0.90


def test_kto_on_unpaired_rows_beats_sft_on_sampled_held_out_accuracy(task):
    root, splits = task["root"], task["splits"]
    # every preference pair as two unpaired rows: the correct solution desirable, the flawed one not
    unpaired = [{"input": r["prompt"], "output": r[kind], "label": kind == "chosen"}
                for r in splits.preference_train for kind in ("chosen", "rejected")]
    cfg = load_config(None, [*TASK, *SFT, *task["files"], "data.preference.paths=[" + write_jsonl(root / "kto.jsonl", unpaired) + "]",
                             "data.preference.unpaired=true", "dpo.loss=kto", "dpo.nll_loss_coef=0", f"dpo.max_steps={KTO_STEPS}",
                             f"dpo.eval_every={KTO_STEPS}", f"dpo.save_every={KTO_STEPS}"])
    made = data_prep.run(make_ctx("data_prep", cfg, root / "prep_kto"), {}).outputs
    assert dpo.is_unpaired(read_split(made["pref_data"], "train")[0])
    result = dpo.run(make_ctx("dpo", cfg, root / "kto"), {"sft_model": task["sft_model"], "pref_data": made["pref_data"]})
    assert result.metrics["eval/reward_accuracy"] > 0.6  # held-out desirable rows outscore undesirable ones
    scorer = build_scorer(task["cfg"].reward, {})
    prompts = read_split(task["prepared"]["eval_data"], "eval")
    sampled = {name: evaluate.evaluate_model(path, task["cfg"], prompts, [], scorer)[0]["sampled_accuracy"]
               for name, path in (("sft", task["sft_model"]), ("kto", result.outputs["dpo_model"]))}
    print(f"sampled held-out accuracy ({len(prompts)} prompts x 4): SFT {sampled['sft']:.3f}, KTO {sampled['kto']:.3f}")
    assert sampled["kto"] > sampled["sft"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_math_shepherd_placeholders_are_one_token_each_in_every_family(family, tmp_path):
    """` ки` after a word is another token than `ки` in a byte-level BPE: data prep makes the placeholder a
    special token, so the prm stage finds every step of a file's rows whatever the family's tokenizer."""
    rows = [{"input": f"Compute {a}+{b} Step 1: {a}+{b}={a + b} {PH}\nStep 2: Answer {a + b}. {PH}", "label": ["+", "+"]}
            for a in range(4) for b in range(4)]
    # a corpus where `ки` alone and ` ки` after a word are tokens of their own
    corpus = [r["input"] for r in rows] * 10 + [PH] * 50 + ["Compute question answer + -"]
    local = save_family_checkpoint(family, tmp_path / "model", corpus)
    own = checkpoint.load_tokenizer(local)
    assert len(own(PH, add_special_tokens=False)["input_ids"]) == 1
    assert own(PH, add_special_tokens=False)["input_ids"][0] not in own(rows[0]["input"], add_special_tokens=False)["input_ids"]
    qa = write_jsonl(tmp_path / "qa.jsonl", [{"input": f"{a}+1", "output": str(a + 1), "label": str(a + 1)} for a in range(8)])
    cfg = load_config(None, [*TASK, "data.source=files", f"model.name_or_path={local}", f"data.sft.paths=[{qa}]",
                             f"data.prompts.paths=[{qa}]", "data.sft.eval_ratio=0.5", "data.prompts.eval_ratio=0.5",
                             "data.prm.paths=[" + write_jsonl(tmp_path / "shepherd.jsonl", rows) + "]", "data.prm.eval_ratio=0.25",
                             f"prm.placeholder_token={PH}"])
    made = data_prep.run(make_ctx("data_prep", cfg, tmp_path / "prep"), {}).outputs
    tokenizer = checkpoint.load_tokenizer(made["base_model"])
    placeholder = prm.single_token_id(tokenizer, PH, "prm.placeholder_token")
    reward_ids = tuple(prm.single_token_id(tokenizer, t, "prm.reward_tokens") for t in ("+", "-"))
    for i, row in enumerate(read_split(made["prm_data"], "train")):
        ids, labels = prm.encode_prm_row(tokenizer, row, placeholder, reward_ids, ("+", "-"), f"row {i}")
        assert sum(label != -100 for label in labels) == 2 and ids.count(placeholder) == 2
